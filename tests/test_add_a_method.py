"""docs/architecture.md's "How to add a method", run as written: its module and its config overlay, taken from the
page."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import torch
import yaml

from flsuite.methods.fedavg import FedAvg
from tests.helpers import head_federation

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def doc_block(language: str, first_line: str) -> str:
    """The page's code block in `language` whose first line is `first_line`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.DOTALL)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/architecture.md has {len(found)} {language} blocks starting {first_line!r}"
    return found[0]


def example_module(tmp_path: Path):
    path = tmp_path / "fedexample.py"
    path.write_text(doc_block("python", "# flsuite/methods/fedexample.py"))
    spec = importlib.util.spec_from_file_location("fedexample", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fedexample"] = module  # pickled method snapshots name their class's module
    spec.loader.exec_module(module)
    return module


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_documented_method_is_fedavg_at_mu_zero_and_keeps_the_mean_loss(tmp_path):
    fedexample = example_module(tmp_path)
    try:
        head_federation(tmp_path / "fedavg", rounds=2, method=FedAvg()).fit()
        head_federation(tmp_path / "mu0", rounds=2, method=fedexample.FedExample(mu=0.0)).fit()
        head_federation(tmp_path / "mu1", rounds=2, method=fedexample.FedExample(mu=1.0)).fit()
    finally:
        del sys.modules["fedexample"]
    base, same, other = records(tmp_path / "fedavg"), records(tmp_path / "mu0"), records(tmp_path / "mu1")
    for a, b in zip(base, same):
        assert b["bytes_up"] - a["bytes_up"] == 4 * len(a["clients"])  # the uploaded float32 loss per client
        assert {k: v for k, v in a.items() if k != "bytes_up"} == {k: v for k, v in b.items() if k != "bytes_up"}
    assert [r["train_loss"] for r in other] != [r["train_loss"] for r in base]  # the proximal term acts at μ > 0
    state = torch.load(tmp_path / "mu0" / "checkpoints" / "last.pt", weights_only=True)
    losses = [same[-1]["client_loss"][str(k)] for k in same[-1]["clients"]]
    torch.testing.assert_close(float(state["server_state"]["mean_loss"]), sum(losses) / len(losses), rtol=1e-6, atol=0)


def test_the_documented_overlay_names_the_documented_class_and_arguments(tmp_path):
    fedexample = example_module(tmp_path)
    del sys.modules["fedexample"]
    overlay = yaml.safe_load(doc_block("yaml", "# configs/examples/fedexample.yaml"))
    assert overlay["method"]["class_path"] == "flsuite.methods.fedexample.FedExample"
    assert fedexample.FedExample(**overlay["method"]["init_args"]).mu == 0.01
