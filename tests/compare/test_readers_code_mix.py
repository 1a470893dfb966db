"""The experiments/ readers that build tables from run folders (fedcir_shares, ggeur_table4_compare, fkpl_clustering)
warn, in the table and on stderr, when the runs they read come from more than one code version (issue 38, item 1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.compare.test_compare import make_run
from tests.helpers import load_experiment

CLEAN = {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "uncommitted": None}
OTHER = CLEAN | {"commit": "b" * 40}


def record(run: Path, code: dict) -> Path:
    (run / "environment.json").write_text(json.dumps({"seed": 0, "code": code}))
    return run


def shares_run(path: Path, code: dict) -> Path:
    run = make_run(path, [{"a": 50.0, "b": 60.0}] * 3, 2)
    history = [
        json.loads(line) | {"client/fedcir/ce": 1.0 + i}
        for i, line in enumerate((run / "metrics.jsonl").read_text().splitlines())
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return record(run, code)


def clustering_run(path: Path, code: dict) -> Path:
    path.mkdir(parents=True)
    clusters = {
        "angles": [[0.0, 20.0], [20.0, 0.0]],
        "labels": [0, 1],
        "clusters": [[0], [1]],
        "purity": 1.0,
        "domains": ["a", "b"],
    }
    (path / "fkpl_clusters.json").write_text(json.dumps(clusters))
    (path / "metrics.jsonl").write_text(json.dumps({"round": 1, "cluster/threshold": 10.0}) + "\n")
    return record(path, code)


def run_main(name: str, argv: list[str], monkeypatch, capsys) -> tuple[str, str]:
    module = load_experiment(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    module.main()
    out, err = capsys.readouterr()
    return out, err


WARNING = "Warning: these runs come from 2 code versions: aaaaaaaaaa (1 run), bbbbbbbbbb (1 run)"


@pytest.mark.parametrize("mixed", [False, True])
def test_fedcir_shares_warns_when_its_runs_mix_code_versions(tmp_path: Path, monkeypatch, capsys, mixed: bool):
    shares_run(tmp_path / "fedcir-a" / "seed0", CLEAN)
    shares_run(tmp_path / "fedavg" / "seed0", OTHER if mixed else CLEAN)  # read through --paired only
    out, err = run_main(
        "fedcir_shares",
        ["--runs", str(tmp_path), "--windows", "2-2", "--paired", "fedcir-a", "fedavg"],
        monkeypatch,
        capsys,
    )
    assert "| fedcir-a (1 seeds) | 2–2 |" in out
    assert (WARNING in out and WARNING in err) is mixed and ("Warning" in out) is mixed


def test_fedcir_shares_cells_are_window_means_per_seed_then_mean_and_sd_over_seeds(tmp_path: Path, monkeypatch, capsys):
    """A diagnostic is read over a window of rounds and over seeds, never from one round's probe (issue 38): seed 0
    logs ce 1, 2, 3 in rounds 1-3 and seed 1 the same plus 4; window 2-3 gives 2.5 and 6.5 per seed, so 4.5 ± 2.83;
    `all` (rounds 2..T) the same here."""
    shares_run(tmp_path / "fedcir-a" / "seed0", CLEAN)
    run = shares_run(tmp_path / "fedcir-a" / "seed1", CLEAN)
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(r | {"client/fedcir/ce": r["client/fedcir/ce"] + 4}) + "\n" for r in history)
    )
    out, _ = run_main("fedcir_shares", ["--runs", str(tmp_path), "--windows", "2-3", "1-1"], monkeypatch, capsys)
    assert "| fedcir-a (2 seeds) | 2–3 | 4.5 ± 2.83 |" in out
    assert "| fedcir-a (2 seeds) | 1–1 | 3 ± 2.83 |" in out
    assert "| fedcir-a (2 seeds) | all | 4.5 ± 2.83 |" in out


@pytest.mark.parametrize("mixed", [False, True])
def test_ggeur_table4_compare_warns_when_its_runs_mix_code_versions(tmp_path: Path, monkeypatch, capsys, mixed: bool):
    record(make_run(tmp_path / "fedavg" / "seed0", [{"a": 50.0, "b": 60.0}] * 3, 2), CLEAN)
    record(make_run(tmp_path / "fedavg-ggeur" / "seed0", [{"a": 55.0, "b": 60.0}] * 3, 2), OTHER if mixed else CLEAN)
    out, err = run_main("ggeur_table4_compare", ["--runs", str(tmp_path)], monkeypatch, capsys)
    assert "| FedAvg | 55.00 → 57.50 (+2.50) |" in out
    assert (WARNING in out and WARNING in err) is mixed and ("Warning" in out) is mixed


@pytest.mark.parametrize("mixed", [False, True])
def test_fkpl_clustering_warns_when_its_runs_mix_code_versions(tmp_path: Path, monkeypatch, capsys, mixed: bool):
    runs = [
        clustering_run(tmp_path / "study" / "fkpl" / f"seed{s}", code)
        for s, code in ((0, CLEAN), (1, OTHER if mixed else CLEAN))
    ]
    out_file = tmp_path / "t.md"
    _, err = run_main("fkpl_clustering", [*map(str, runs), "--out", str(out_file)], monkeypatch, capsys)
    text = out_file.read_text()
    assert "| 10 | 2.00 | 2–2 | 1.000 |" in text
    assert (WARNING in text and WARNING in err) is mixed and ("Warning" in text) is mixed
