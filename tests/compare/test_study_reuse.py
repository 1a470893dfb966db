"""The study drivers reuse a run folder only when it is the same experiment (flsuite.provenance.same_experiment):
experiments/study.py and experiments/fedegg_study.py rerun a folder whose config or recorded commit differs (the old
one moved to `.replaced/`, the reason printed) and reuse an identical one."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flsuite.provenance import code_version
from tests.helpers import load_experiment, study_in_this_process

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "data": {"class_path": "flsuite.data.builtin.GaussianFeatures", "init_args": {"dim": 8, "samples_per_client": 32}},
    "model": {"class_path": "flsuite.models.heads.Linear"},
    "rounds": 1,
    "last_k": 1,
}


@pytest.fixture(scope="module")
def study():
    return load_experiment("study")


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


def fit(study, base: Path, run_dir: Path, overlay: str = "") -> None:
    """The run as the study's command makes it, in this process (so it records this process's code version)."""
    from flsuite.cli import main

    assert main(["fit", *study.config_args(base, overlay), "--run_dir", str(run_dir), *study.common_args(0, [])]) == 0


def fake_commit(run_dir: Path, commit: str) -> None:
    """Make the run's record say it was made by `commit` with a clean tree."""
    env = json.loads((run_dir / "environment.json").read_text())
    env["code"] = env["code"] | {"commit": commit, "dirty": False, "uncommitted": None}
    (run_dir / "environment.json").write_text(json.dumps(env))


def test_study_reuses_the_same_run_and_reruns_one_whose_config_differs(study, base: Path, tmp_path: Path, capsys):
    run_dir = tmp_path / "runs" / "s" / "base" / "seed0"
    fit(study, base, run_dir)
    capsys.readouterr()
    assert study.needs_run(run_dir, base, "", 0, []) is False  # the study's own resolved config and this code: reused
    assert capsys.readouterr().out == "" and (run_dir / "summary.json").is_file()

    assert study.needs_run(run_dir, base, "--local.lr=0.5", 0, []) is True  # the variant now sets another learning rate
    out = capsys.readouterr().out
    moved = next((run_dir.parent / ".replaced").iterdir())
    assert (
        f"{run_dir}: not reused, runs again (its config differs: local.lr: 0.01 -> 0.5); the old run is now {moved}"
        in out
    )
    assert not run_dir.exists() and (moved / "summary.json").is_file()


def test_study_continues_a_killed_run_of_the_same_experiment_and_restarts_one_of_other_code(
    study, base: Path, tmp_path: Path, capsys
):
    run_dir = tmp_path / "runs" / "s" / "base" / "seed0"
    fit(study, base, run_dir)
    (run_dir / "summary.json").unlink()  # killed after its last checkpoint
    assert study.needs_run(run_dir, base, "", 0, []) is True and run_dir.is_dir()  # continued in place:
    assert "--resume" in study.fit_command(base, "", 0, run_dir, [])
    fake_commit(run_dir, "f" * 40)
    capsys.readouterr()
    assert study.needs_run(run_dir, base, "", 0, []) is True and not run_dir.exists()  # other code: moved, run afresh
    assert f"it was made by code ffffffffff (flsuite {code_version()['version']})" in capsys.readouterr().out
    assert "--resume" not in study.fit_command(base, "", 0, run_dir, [])


@pytest.mark.slow
def test_study_main_reuses_an_identical_run_and_reruns_one_whose_commit_differs(
    study, base: Path, tmp_path: Path, monkeypatch, capsys
):
    """The whole driver: a finished run of the same experiment is reused (no fit), one of another commit is rerun by
    `flsuite fit` (recording the commit it runs), the old folder kept aside; the table is the new run's. The driver's
    `flsuite` commands run in this process (`study_in_this_process`: the decisions are the driver's, not its
    processes')."""
    pool = study_in_this_process(study, monkeypatch)
    runs = tmp_path / "runs"
    run_dir = runs / "s" / "base" / "seed0"
    fit(study, base, run_dir)
    argv = [
        "study.py",
        "--name",
        "s",
        "--base",
        str(base),
        "--variant",
        "base=",
        "--seeds",
        "0",
        "--workers",
        "1",
        "--runs",
        str(runs),
    ]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "first.md")])
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    study.main()
    out = capsys.readouterr().out
    assert (
        f"reusing 1 finished run(s): same config and code ({study_label()})" in out
        and "exit" not in out
        and pool.runs == 0
    )
    stamp = (run_dir / "summary.json").stat().st_mtime_ns

    fake_commit(run_dir, "f" * 40)
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "second.md")])
    study.main()
    out = capsys.readouterr().out
    assert (
        f"{run_dir}: not reused, runs again (it was made by code ffffffffff" in out
        and "base seed 0: exit 0" in out
        and pool.runs == 1
    )
    moved = next((run_dir.parent / ".replaced").iterdir())
    assert json.loads((moved / "environment.json").read_text())["code"]["commit"] == "f" * 40
    assert (
        json.loads((run_dir / "environment.json").read_text())["code"]["commit"] != "f" * 40
    )  # the commit checked out
    assert (run_dir / "summary.json").stat().st_mtime_ns != stamp and (tmp_path / "second.md").read_text().count(
        "| base |"
    ) == 2


def study_label() -> str:
    from flsuite.provenance import code_label

    return code_label(code_version())


def fedegg_study_with_finished_runs(tmp_path: Path, monkeypatch) -> tuple[Any, list[tuple[Path, dict]]]:
    """experiments/fedegg_study.py with its runs under tmp_path and its federation (MNIST, the guiding set) replaced by
    one that writes what a finished run writes (its resolved config, this code's version, a summary); and the list of
    (run folder, resolved config) of every run made, in order."""
    fedegg = load_experiment("fedegg_study")
    monkeypatch.chdir(ROOT)  # the study's config paths are relative to the repository
    monkeypatch.setattr(fedegg, "RUNS", tmp_path / "runs")
    made: list[tuple[Path, dict]] = []

    class Finished:
        def __init__(self, run_dir: Path) -> None:
            self.run_dir = run_dir

        def fit(self, config_yaml: str) -> None:
            self.run_dir.mkdir(parents=True)
            (self.run_dir / "config.yaml").write_text(config_yaml)
            (self.run_dir / "environment.json").write_text(json.dumps({"code": code_version()}))
            (self.run_dir / "summary.json").write_text("{}")
            made.append((self.run_dir, yaml.safe_load(config_yaml)))

    monkeypatch.setattr(fedegg, "federation", lambda cfg, configs, seed, setting: Finished(Path(cfg.run_dir)))
    return fedegg, made


def test_fedegg_study_reruns_a_run_of_another_commit_or_config_and_reuses_the_same(tmp_path: Path, monkeypatch, capsys):
    """fedegg_study.run with the run's real resolved config; the federation (MNIST, the guiding set) is replaced by
    one that writes what a finished run writes."""
    fedegg, made = fedegg_study_with_finished_runs(tmp_path, monkeypatch)
    run_dir = fedegg.run("table", "dir0.1", "FedAvg + LH", [fedegg.LEVELS["LH"]], 0)
    assert [d for d, _ in made] == [
        run_dir
    ] and run_dir == tmp_path / "runs" / "table" / "dir0.1" / "FedAvg_LH" / "seed0"
    assert (
        fedegg.run("table", "dir0.1", "FedAvg + LH", [fedegg.LEVELS["LH"]], 0) == run_dir and len(made) == 1
    )  # reused
    capsys.readouterr()

    fake_commit(run_dir, "f" * 40)
    fedegg.run("table", "dir0.1", "FedAvg + LH", [fedegg.LEVELS["LH"]], 0)
    assert len(made) == 2 and "not reused, runs again (it was made by code ffffffffff" in capsys.readouterr().out

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["server_steps"][0]["init_args"]["steps"] = 5  # as a strength variant ("LH T5") would have made it
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    fedegg.run("table", "dir0.1", "FedAvg + LH", [fedegg.LEVELS["LH"]], 0)
    assert len(made) == 3 and "its config differs: server_steps.0.init_args.steps: 5 -> 1" in capsys.readouterr().out
    assert len(list((run_dir.parent / ".replaced").iterdir())) == 2  # both old runs kept aside


def test_fedegg_noise_study_fixes_the_data_seed_varies_the_training_seed_and_shares_the_strength_runs(
    tmp_path: Path, monkeypatch
):
    """The noise study (issue 38): a run whose training seed is its data seed is the strength study's seed run (one
    run, not two); the others are data_seed/train_seed runs of the same config, each written where it says."""
    fedegg, runs = fedegg_study_with_finished_runs(tmp_path, monkeypatch)
    same = fedegg.noise_run("dir10", "LH shared", 1, 1)
    assert same == fedegg.strength_run("dir10", "FedAvg", "LH shared", 1) and len(runs) == 1
    assert same == tmp_path / "runs" / "strength" / "dir10" / "FedAvg_LHshared" / "seed1"
    other = fedegg.noise_run("dir10", "LH shared", 1, 3)
    assert other == tmp_path / "runs" / "noise" / "dir10" / "FedAvg_LHshared" / "data1_train3"
    plain = fedegg.noise_run("dir10", None, 1, 3)
    assert plain == tmp_path / "runs" / "noise" / "dir10" / "FedAvg" / "data1_train3"
    made = dict(runs)  # run folder -> its resolved config
    a, b = made[same], made[other]
    assert (a["seed"], a.get("data_seed"), a.get("train_seed")) == (1, None, None)
    assert (b["seed"], b["data_seed"], b["train_seed"]) == (1, 1, 3)
    assert b["server_steps"][0]["init_args"]["shared_head"] is True and b["rounds"] == a["rounds"]
    differing = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differing == {"data_seed", "train_seed", "run_dir"}
    assert made[plain].get("server_steps") in (None, [])
    # another method (--methods FedNova): its own runs, its config the method's overlay on the same seeds
    nova = fedegg.noise_run("dir10", "LH", 1, 3, "FedNova")
    assert nova == tmp_path / "runs" / "noise" / "dir10" / "FedNova_LH" / "data1_train3"
    assert fedegg.noise_run("dir10", "LH", 1, 1, "FedNova") == fedegg.strength_run("dir10", "FedNova", "LH", 1)
    made = dict(runs)
    assert made[nova]["method"]["class_path"].endswith("FedNova") and made[nova]["train_seed"] == 3
    assert fedegg.noise_runs([1], [3], ["FedNova"]) == [
        (setting, variant, 1, 3, "FedNova") for setting in fedegg.SETTINGS for variant in fedegg.NOISE.values()
    ]


def test_fedegg_levels_and_tau_rows_pair_each_seed_with_fedavgs_run_of_that_seed():
    """The levels/τ tables' paired cells (issue 38): per-seed Δ against FedAvg's run of the same seed, then mean ± SE
    and the t interval; one seed gives no interval."""
    fedegg = load_experiment("fedegg_study")
    cells = fedegg.against_fedavg([75.0, 74.0, 77.0], [74.0, 74.0, 75.0])
    # Δ = +1, 0, +2: mean +1.00, SD 1, SE 1/√3 = 0.58, t(0.975, 2) = 4.303 -> ±2.48
    assert cells == "+1.00 / +0.00 / +2.00 | +1.00 ± 0.58 [-1.48, +3.48], not resolved"
    assert fedegg.against_fedavg([75.0, 76.0, 77.5], [74.0, 74.8, 76.4]).endswith(
        "+1.10 ± 0.06 [+0.85, +1.35], resolved"
    )
    assert fedegg.against_fedavg([75.0], [74.5]) == "+0.50 | +0.50, not resolved (1 pair)"
