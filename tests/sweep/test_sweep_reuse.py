"""A resumed `flsuite sweep` reuses its finished trials only when each is the run it would make now (same resolved
config and code, flsuite.provenance.same_experiment), and otherwise stops before running anything, naming the trial
and why."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from flsuite import provenance
from flsuite import sweep as sw

CLEAN = {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "uncommitted": None}
BASE = {
    "data": {"class_path": "flsuite.data.builtin.GaussianFeatures", "init_args": {"dim": 8, "samples_per_client": 32}},
    "model": {"class_path": "flsuite.models.heads.Linear"},
    "rounds": 1,
    "wandb": {"enabled": False},
}


def trials_in(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT COUNT(*) FROM trials").fetchone()[0]


def set_code(run_dir: Path, code: dict) -> None:
    env = json.loads((run_dir / "environment.json").read_text())
    (run_dir / "environment.json").write_text(json.dumps(env | {"code": code}))


@pytest.mark.slow
def test_a_resumed_sweep_reuses_the_same_trials_and_stops_on_another_commit_or_config(
    tmp_path: Path, monkeypatch, caplog
):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    file = tmp_path / "sweep.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "name": "reuse",
                "method": "grid",
                "metric": {"name": "last5/acc_mean", "goal": "maximize"},
                "parameters": {"local.lr": {"values": [0.05]}, "local.epochs": {"value": 1}},
                "command": ["${env}", "flsuite", "fit", "--config", str(base), "${args}"],
            }
        )
    )
    out = tmp_path / "out"
    study = sw.Sweep(file, out).run()  # one real `flsuite fit` trial
    run_dir = Path(study.trials[0].user_attrs["run_dir"])
    assert study.trials[0].state.name == "COMPLETE" and (run_dir / "environment.json").is_file()
    # This process and the trial's record are given one clean code version (the tree may change while tests run).
    monkeypatch.setattr(provenance, "code_version", lambda: CLEAN)
    set_code(run_dir, CLEAN)

    caplog.set_level("INFO", logger="flsuite.sweep")
    sw.Sweep(file, out).run()  # the same sweep again: its trial is the same experiment, nothing runs
    assert "sweep reuse: reusing 1 finished trial(s): same config and code (aaaaaaaaaa)" in caplog.text
    assert trials_in(out / "study.db") == 1

    set_code(run_dir, CLEAN | {"commit": "b" * 40})
    with pytest.raises(
        sw.SweepError,
        match=rf"holds 1 finished trial\(s\) .*trial 0 \({run_dir}\): it was made by code bbbbbbbbbb "
        r"\(flsuite 0.1.0\), this is aaaaaaaaaa",
    ):
        sw.Sweep(file, out).run()
    set_code(run_dir, CLEAN)
    with pytest.raises(
        sw.SweepError, match=r"trial 0 .*: its config differs: rounds: 1 -> 2\. Run the sweep into another --out"
    ):
        sw.Sweep(file, out, extra=["--rounds=2"]).run()  # flags after -- that change the experiment
    assert trials_in(out / "study.db") == 1  # stopped before running anything
