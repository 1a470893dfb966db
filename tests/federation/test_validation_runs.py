"""Runs with a validation split: `val/` metrics are `evaluate` on it, their last-k means reach the summary, fraction 0
is the run without the option, and a bad fraction is a one-paragraph CLI error naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flsuite.data.validation import ValidationSplit
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.metrics import evaluate
from tests.helpers import SMALL_CONFIG, head_federation, run_cli, write_config


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_val_keys_are_evaluate_on_the_validation_split(tmp_path: Path):
    fed = head_federation(tmp_path / "run", validation=ValidationSplit(0.2), rounds=2)
    summary = fed.fit()
    data = fed.build_data()[0]
    assert {d: len(s) for d, s in data.validation.items()} == {
        "domain0": 24,
        "domain1": 24,
    }  # 2 clients × round(0.2·60)
    history = lines(tmp_path / "run" / "metrics.jsonl")
    model = fed.model.build(data.input_shape, data.num_classes)
    model.load_state_dict(load_checkpoint(tmp_path / "run").global_weights)
    expected = evaluate(model, data.validation, data.num_classes)
    assert {k.removeprefix("val/"): v for k, v in history[-1].items() if k.startswith("val/")} == expected
    assert list(expected) == ["acc/domain0", "acc/domain1", "acc_mean", "acc_std", "acc_std_sample"]
    assert evaluate(model, data.test, data.num_classes)["acc_mean"] == history[-1]["acc_mean"]  # test: unchanged keys
    assert summary["last5/val/acc_mean"] == pytest.approx(np.mean([r["val/acc_mean"] for r in history]))
    assert summary["last/val/acc_mean"] == history[-1]["val/acc_mean"] and "best/val/acc_mean" not in summary
    domain_means = [np.mean([r[f"val/acc/{d}"] for r in history]) for d in ("domain0", "domain1")]
    assert summary["last5/val/acc_std"] == pytest.approx(np.std(domain_means))
    partition = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert [c["num_samples"] for c in partition["clients"]] == [48] * 4 and partition["validation"] == {
        "domain0": 24,
        "domain1": 24,
    }


def test_fraction_zero_is_byte_identical_to_no_option(tmp_path: Path):
    plain = head_federation(tmp_path / "plain", rounds=2).fit()
    zero = head_federation(tmp_path / "zero", rounds=2, validation=ValidationSplit(0.0)).fit()
    for name in ("metrics.jsonl", "summary.json", "partition.json"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "zero" / name).read_bytes(), name
    assert not any(k.startswith(("val/", "last5/val/")) for k in plain) and zero.keys() == plain.keys()
    assert not any(
        k.startswith("val/") for r in lines(tmp_path / "zero" / "metrics.jsonl") for k in r
    )  # the old records
    assert "validation" not in json.loads((tmp_path / "zero" / "partition.json").read_text())  # the old partition.json


def test_cli_fraction_errors_name_the_key(tmp_path: Path, capsys):
    config = write_config(tmp_path / "small.yaml", SMALL_CONFIG)
    code, _, err = run_cli(
        ["fit", "--config", str(config), "--run_dir", str(tmp_path / "a"), "--validation.fraction", "1.0"], capsys
    )
    assert code == 2 and "validation.fraction must be in [0, 1), got 1.0" in err
    tiny = [
        "--data.init_args.clients_per_domain",
        "300",
        "--validation.fraction",
        "0.9",
    ]  # 2-3 samples a client: all held out
    code, _, err = run_cli(["fit", "--config", str(config), "--run_dir", str(tmp_path / "b"), *tiny], capsys)
    assert code == 2 and "validation.fraction=0.9 holds out 3 of client 0's 3 training samples (domain 'clean')" in err


def test_a_setup_stage_keeps_the_validation_split_and_never_sees_it():
    from flsuite.data.builtin import GaussianFeatures
    from flsuite.methods.ggeur import GGEUR

    raw = GaussianFeatures(
        dim=4, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=40, test_per_domain=6
    ).build(seed=0)
    data = ValidationSplit(0.25).apply(raw, seed=0)
    out = GGEUR(target_per_class=20, samples_per_prototype=2).run(data, seed=0).data
    assert out.validation is data.validation and {d: len(s) for d, s in out.validation.items()} == {
        "domain0": 10,
        "domain1": 10,
    }
    for before, after in zip(data.clients, out.clients):  # the augmented clients: their 30 training samples, in front
        assert len(before.train) == 30 and after.train.x[:30].equal(before.train.x)


def test_a_run_begun_before_the_option_resumes_at_fraction_zero_and_another_fraction_changes_the_experiment():
    import yaml

    from flsuite.cli import option_defaults
    from flsuite.runfolder import check_resume_config

    assert option_defaults()["validation.fraction"] == 0.0
    old = yaml.safe_dump({"seed": 0})
    assert (
        check_resume_config(
            old, yaml.safe_dump({"seed": 0, "validation": {"fraction": 0.0}}), "r", defaults=option_defaults
        ).blocking
        == []
    )
    with pytest.raises(ValueError, match=r"changes the experiment.*validation\.fraction: \(absent\) -> 0\.1"):
        check_resume_config(
            old, yaml.safe_dump({"seed": 0, "validation": {"fraction": 0.1}}), "r", defaults=option_defaults
        )
