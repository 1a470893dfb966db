"""W&B logging works offline with no API key, and the mode resolution rules."""

from __future__ import annotations

import json

from flsuite.tracking import WandbConfig, _resolve_wandb_mode
from tests.helpers import head_federation


def test_wandb_mode_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert _resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert _resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _resolve_wandb_mode("online") == "disabled"


def test_offline_wandb_run_is_written_with_no_api_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    fed = head_federation(tmp_path / "run", rounds=2, name="wandb-test", wandb=WandbConfig(enabled=True, project="flsuite-tests"))
    summary = fed.fit(config_yaml="seed: 7\n")
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "expected one offline W&B run in the run folder"
    assert list(runs[0].glob("run-*.wandb")), "the offline run has no data file"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["last/acc_mean"] == summary["last/acc_mean"]
