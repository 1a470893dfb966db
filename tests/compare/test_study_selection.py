"""experiments/study.py `--select_on val`: each method group keeps its best *validation* variant (a constructed case
where the best test variant is another), the table states the grid and the choice, and without the option nothing
changes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from flsuite.metrics import domain_summary, final_summary
from tests.helpers import load_experiment


def load_study():
    return load_experiment("study")


def make_run(path: Path, test: float, val: float | None, config: dict) -> None:
    """A finished one-round run with test accuracy `test` and validation accuracy `val` on domains x, y."""
    path.mkdir(parents=True)
    record = {"round": 1, "clients": [0], "bytes_down": 1, "bytes_up": 1, **domain_summary({"x": test, "y": test})}
    if val is not None:
        record |= {f"val/{k}": v for k, v in domain_summary({"x": val, "y": val}).items()}
    (path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (path / "config.yaml").write_text(yaml.safe_dump({"last_k": 1, "seed": int(path.name[4:]), **config}))
    (path / "summary.json").write_text(json.dumps(final_summary([record], last_k=1)))


def fedprox(mu: float) -> dict:
    return {"method": {"class_path": "flsuite.methods.fedprox.FedProx", "init_args": {"mu": mu}}}


VARIANTS = [
    ("FedAvg", ""),
    ("FedProx [mu 0.01]", "configs/baselines/fedprox.yaml,--method.init_args.mu=0.01"),
    ("FedProx [mu 0.1]", "configs/baselines/fedprox.yaml,--method.init_args.mu=0.1"),
    ("FedProx [mu 1]", "configs/baselines/fedprox.yaml,--method.init_args.mu=1"),
]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Seeds 0 and 1. Validation: mu 0.01 best (70, 72); test: mu 0.1 best (90, 92) though it validates at 60."""
    study = load_study()
    fedavg = {"method": {"class_path": "flsuite.methods.fedavg.FedAvg", "init_args": {}}}
    table = {
        "FedAvg": (50, 55, fedavg),
        "FedProx [mu 0.01]": (60, 70, fedprox(0.01)),
        "FedProx [mu 0.1]": (90, 60, fedprox(0.1)),
    }
    table["FedProx [mu 1]"] = (40, 65, fedprox(1.0))
    for label, (test, val, config) in table.items():
        for seed in (0, 1):
            make_run(tmp_path / study.slug(label) / f"seed{seed}", test + 2 * seed, val + 2 * seed, config)
    return tmp_path


def test_select_on_val_picks_the_best_validation_variant_not_the_best_test_one(runs: Path):
    study = load_study()
    chosen, _ = study.select(VARIANTS, [0, 1], runs)
    assert [label for label, _ in chosen] == ["FedAvg", "FedProx [mu 0.01]"]
    text = study.table("S", VARIANTS, [0, 1], runs, "cmd", select_on="val")
    assert "| FedProx [mu 0.01] | 61.00 ± 1.00 | 61.00 ± 1.00 | 61.00 ± 1.00 |" in text  # the chosen one's test numbers
    assert (
        "| FedProx [mu 0.1] |" not in text and "| FedProx [mu 1] |" not in text
    )  # the others' test numbers: never shown
    row = (
        "| FedProx | `method.init_args.mu` ∈ {0.01, 0.1, 1.0} | **FedProx [mu 0.01]: 71.00 ± 1.00**; FedProx "
        "[mu 0.1]: 61.00 ± 1.00; "
    )
    assert row + "FedProx [mu 1]: 66.00 ± 1.00 | FedProx [mu 0.01] | `method.init_args.mu=0.01` |" in text
    assert "| FedAvg | — | **FedAvg: 56.00 ± 1.00** | FedAvg | — |" in text
    assert text.index("Chosen on validation data") < text.index("Regenerate with:")


def test_without_the_option_the_table_is_unchanged(runs: Path):
    study = load_study()
    text = study.table("S", VARIANTS, [0, 1], runs, "cmd")
    assert "| FedProx [mu 0.1] | 91.00 ± 1.00 |" in text and "Chosen on validation" not in text
    assert text == "\n".join(
        [study.comparison(VARIANTS, [0, 1], runs).markdown("S"), "Regenerate with:", "", "```bash", "cmd", "```", ""]
    )


def test_a_run_without_validation_metrics_stops_the_selection(tmp_path: Path):
    study = load_study()
    make_run(tmp_path / "fedavg" / "seed0", 50, None, {"method": {"class_path": "flsuite.methods.fedavg.FedAvg"}})
    with pytest.raises(SystemExit, match=r"seed0 has no last1/val/acc_mean in summary.json"):
        study.select([("FedAvg", "")], [0], tmp_path)


def test_variant_flags_go_to_fit_and_a_study_without_validation_stops_before_running(tmp_path: Path, monkeypatch):
    study = load_study()
    cmd = study.fit_command(Path("b.yaml"), "o.yaml,--method.init_args.mu=0.1", 0, tmp_path / "r", ["--rounds", "2"])
    assert cmd[4:9] == ["--config", "b.yaml", "--config", "o.yaml", "--method.init_args.mu=0.1"]
    base = tmp_path / "base.yaml"
    base.write_text("rounds: 2\n")
    (tmp_path / "val.yaml").write_text("validation: {fraction: 0.2}\n")
    assert study.validation_fraction(base, "", []) == 0.0
    assert study.validation_fraction(base, str(tmp_path / "val.yaml"), []) == 0.2
    assert study.validation_fraction(base, "--validation.fraction=0.3", ["--validation.fraction", "0.1"]) == 0.1
    argv = [
        "study.py",
        "--name",
        "s",
        "--base",
        str(base),
        "--variant",
        "A=",
        "--variant",
        f"B={tmp_path / 'val.yaml'}",
        "--runs",
        str(tmp_path),
    ]
    monkeypatch.setattr(sys, "argv", [*argv, "--select_on", "val"])
    with pytest.raises(SystemExit, match=r"variant\(s\) \['A'\] run with validation.fraction 0"):
        study.main()
    assert not (tmp_path / "s").exists()  # nothing ran


def test_select_seeds_runs_the_grid_on_those_seeds_and_only_the_chosen_variants_on_the_others(
    tmp_path: Path, monkeypatch
):
    """--select_seeds 0: every grid variant runs on seed 0 and the choice is made there; then only the chosen variant
    of each group runs on seeds 1 and 2, and the test table is the chosen variants' over all three seeds."""
    study = load_study()
    base = tmp_path / "base.yaml"
    base.write_text("rounds: 1\nvalidation: {fraction: 0.1}\n")
    scores = {"--method.init_args.mu=0.01": (60, 70), "--method.init_args.mu=0.1": (90, 60)}  # (test, validation)
    ran: list[tuple[str, int]] = []

    def fake_run(cmd: list[str], log: Path, parallel: int = 1, pool: object = None) -> int:
        if cmd[3] == "features":
            return 0
        seed, run_dir = int(cmd[cmd.index("--seed") + 1]), Path(cmd[cmd.index("--run_dir") + 1])
        flag = next(a for a in cmd if a.startswith("--method.init_args.mu="))
        ran.append((flag, seed))
        test, val = scores[flag]
        make_run(run_dir, test + seed, val + seed, fedprox(float(flag.split("=")[1])))
        return 0

    monkeypatch.setattr(study, "run", fake_run)
    variants = [
        "--variant",
        "FedProx [mu 0.01]=--method.init_args.mu=0.01",
        "--variant",
        "FedProx [mu 0.1]=--method.init_args.mu=0.1",
    ]
    argv = [
        "study.py",
        "--name",
        "s",
        "--base",
        str(base),
        *variants,
        "--runs",
        str(tmp_path),
        "--workers",
        "1",
        "--out",
        str(tmp_path / "t.md"),
    ]
    monkeypatch.setattr(sys, "argv", [*argv, "--select_on", "val", "--select_seeds", "0", "--seeds", "0", "1", "2"])
    study.main()
    assert ran == [
        ("--method.init_args.mu=0.01", 0),
        ("--method.init_args.mu=0.1", 0),
        ("--method.init_args.mu=0.01", 1),
        ("--method.init_args.mu=0.01", 2),
    ]
    text = (tmp_path / "t.md").read_text()
    assert "| FedProx [mu 0.01] | 61.00 ± 0.82 |" in text  # test: 60, 61, 62 over the three seeds
    assert "**FedProx [mu 0.01]: 70.00**; FedProx [mu 0.1]: 60.00 |" in text  # chosen on seed 0 alone
    monkeypatch.setattr(sys, "argv", [*argv, "--select_seeds", "0"])
    with pytest.raises(SystemExit, match="needs --select_on"):
        study.main()
