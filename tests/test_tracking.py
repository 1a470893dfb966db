"""W&B logging works offline with no API key, and the mode resolution rules."""

from __future__ import annotations

import json

from flsuite.tracking import WandbConfig, _resolve_wandb_mode, run_labels, wandb_scalars
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


def test_offline_wandb_run_is_written_with_no_api_key(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    caplog.set_level("INFO", logger="flsuite.tracking")
    fed = head_federation(
        tmp_path / "run", rounds=2, name="wandb-test", wandb=WandbConfig(enabled=True, project="flsuite-tests")
    )
    summary = fed.fit(config_yaml="seed: 7\n")
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "expected one offline W&B run in the run folder"
    assert list(runs[0].glob("run-*.wandb")), "the offline run has no data file"
    assert f"upload this run with: wandb sync {runs[0]}" in caplog.text  # the path the user must pass
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["last/acc_mean"] == summary["last/acc_mean"]


def test_wandb_scalars_keep_numbers_and_flatten_per_client_mappings():
    record = {
        "round": 3,
        "acc_mean": 50.5,
        "clients": [0, 2],
        "clients_failed": [],
        "ok": True,
        "client_loss": {"0": 0.5, "2": 0.25},
        "client_steps": {"0": 4, "2": 7},
    }
    assert wandb_scalars(record) == {
        "round": 3,
        "acc_mean": 50.5,
        "client_loss/0": 0.5,
        "client_loss/2": 0.25,
        "client_steps/0": 4,
        "client_steps/2": 7,
    }


def test_run_labels_name_the_method_with_its_setup_stages_and_the_dataset():
    from flsuite.data.builtin import GaussianFeatures
    from flsuite.methods.fedprox import FedProx
    from flsuite.methods.ggeur import GGEUR

    labels = run_labels(FedProx(), GaussianFeatures(), [GGEUR()])
    assert labels == {"method_name": "FedProx+GGEUR", "dataset": "GaussianFeatures"}

    class Suite:
        suite = "pacs"

    assert run_labels(FedProx(), Suite())["dataset"] == "pacs"


def test_the_final_wandb_table_follows_last_k(tmp_path, monkeypatch):
    """The per-domain W&B table uses the run's last_k (not a hard-coded 5)."""
    import json as _json

    from flsuite.tracking import WandbConfig
    from tests.helpers import head_federation

    monkeypatch.setenv("WANDB_MODE", "offline")
    logged = {}
    import wandb

    real_log = wandb.sdk.wandb_run.Run.log

    def spy(self, data, *a, **k):
        if "final_per_domain" in data:
            logged["table"] = data["final_per_domain"]
        return real_log(self, data, *a, **k)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    summary = head_federation(tmp_path, rounds=3, last_k=2, wandb=WandbConfig(enabled=True)).fit()
    table = logged["table"]
    assert table.columns == ["domain", "last2_avg", "last"]
    assert [row[1] for row in table.data] == [summary[f"last2/acc/{d}"] for d in ("domain0", "domain1")]
    assert _json.loads((tmp_path / "summary.json").read_text())["last2/rounds"] == 2


def test_the_partition_plot_of_a_large_federation_is_bounded(tmp_path):
    """One label per client made a 1,000-client run's start-up ~20 s and its figure 300 inches tall."""
    from PIL import Image

    from flsuite.plots import plot_partition

    stats = {"clients": [{"client": k, "domain": "d", "per_class": [k % 3, 1, 2]} for k in range(2000)]}
    plot_partition(stats, tmp_path / "p.png")
    width, height = Image.open(tmp_path / "p.png").size
    assert height <= 12 * 100 and width < 1000  # 2,000 rows at 0.3 inch each would be 60,000 px tall


WANDB_NOISE = """
import logging, sys
from pathlib import Path
import wandb
from flsuite.tracking import Tracker, WandbConfig
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # as the CLI does
run_dir = Path(sys.argv[1])
tracker = Tracker(run_dir / "ours", WandbConfig(enabled=True, project="flsuite-tests"), "g", {})
tracker.wandb_run.log({"x": 1.0}, step=5)
tracker.wandb_run.log({"x": 2.0}, step=2)  # a genuine W&B warning: a step logged out of order
tracker.close()
print("--- the user's own run ---", file=sys.stderr, flush=True)
wandb.init(mode="offline", project="flsuite-tests", dir=str(run_dir), reinit="create_new").finish()
"""


def test_an_offline_run_drops_wandbs_wandb_online_banner_for_its_own_run_only(tmp_path):
    """W&B's offline banner ("Run `wandb online` ...") is silenced for flsuite's run only (its run settings), while
    W&B's warnings still show, flsuite says why it is offline and how to sync, and a user's own run keeps the banner."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SILENT", "WANDB_QUIET")
    }
    env["NETRC"] = str(tmp_path / "no-netrc")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", WANDB_NOISE, str(tmp_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    ours, _, users = proc.stderr.partition("--- the user's own run ---")
    assert users, proc.stderr
    assert "wandb online" not in ours and "syncing is set to `offline`" not in ours, ours
    assert "Tried to log to step 2 that is less than the current step 5" in ours  # W&B's genuine warning
    assert "W&B logs offline (no W&B API key; `wandb login` or WANDB_API_KEY makes runs online)" in ours
    assert "upload this run with: wandb sync" in ours
    assert "Run `wandb online`" in users  # W&B's own behaviour outside flsuite's run is untouched


def test_environment_json_records_the_code_version(tmp_path):
    """The package version, git commit and uncommitted changes (flsuite.provenance.code_version) of the code that
    made the run: what a study driver compares before it reuses the folder."""
    from flsuite.provenance import code_version

    head_federation(tmp_path / "run", rounds=1).fit(config_yaml="seed: 7\n")
    recorded = json.loads((tmp_path / "run" / "environment.json").read_text())["code"]
    assert recorded == code_version() and set(recorded) == {"version", "commit", "dirty", "uncommitted"}
