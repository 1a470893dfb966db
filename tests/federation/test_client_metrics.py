"""The engine's per-client metrics channel (`ClientModule.metrics` → `ClientResult.metrics` → the round record's
`client/<method>/<key>`, sample-weighted) and the once-per-fit `ClientModule.probe`, isolated from the training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flsuite import records
from flsuite.data.builtin import UCIDigitsDomains
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.phases import client_metrics
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import Linear, ModelSpec, SequentialClassifier
from tests.helpers import head_federation

DIGITS = UCIDigitsDomains(domains=("clean", "rotated"), clients_per_domain=2, beta=0.5, flatten=True)  # unequal clients


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class ReportingClient(ClientModule):
    """Reports its client id (every client) and a constant (client 0 only)."""

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        return {"id": float(self.task.client_id), **({"only_zero": 5.0} if self.task.client_id == 0 else {})}


class Reporting(FedAvg):
    client_module = ReportingClient


def test_client_metrics_are_sample_weighted_under_the_method_name(tmp_path):
    fed = head_federation(tmp_path, data=DIGITS, model=Linear(), rounds=1, method=Reporting())
    fed.fit()
    data = fed.build_data()[0]
    n = [len(c.train) for c in data.clients]
    assert len(set(n)) > 1  # unequal clients: a weighted mean differs from the plain one
    (record,) = metrics(tmp_path)
    expected = sum(k * n_k for k, n_k in enumerate(n)) / sum(n)
    assert record["client/reporting/id"] == pytest.approx(expected, rel=1e-12)
    assert record["client/reporting/id"] != pytest.approx(sum(range(len(n))) / len(n), rel=1e-3)
    assert record["client/reporting/only_zero"] == 5.0  # over the clients that report it
    keys = list(record)
    assert keys.index("client/reporting/id") == keys.index(records.CLIENT_STEPS) + 1


def test_a_method_without_metrics_adds_no_keys(tmp_path):
    head_federation(tmp_path, data=DIGITS, model=Linear(), rounds=1).fit()
    (record,) = metrics(tmp_path)
    assert not [k for k in record if k.startswith(records.CLIENT_PREFIX)]
    schema = [records.ROUND, records.CLIENTS, records.CLIENTS_FAILED, records.CLIENTS_REJECTED, records.TRAIN_LOSS]
    schema += [records.BYTES_DOWN, records.BYTES_UP, records.CLIENT_LOSS, records.CLIENT_STEPS]
    assert list(record)[: len(schema)] == schema and list(record)[len(schema)].startswith(records.ACC_PREFIX)
    assert client_metrics("FedAvg", [ClientResult(0, 3, {}), ClientResult(1, 1, {})]) == {}


def test_client_metrics_by_hand():
    results = [ClientResult(0, 1, {}, metrics={"a": 2.0, "b": 1.0}), ClientResult(1, 3, {}, metrics={"a": 6.0})]
    assert client_metrics("FedCiR", results) == {"client/fedcir/a": (1 * 2.0 + 3 * 6.0) / 4, "client/fedcir/b": 1.0}
    assert records.client_metric_key("FedCiR", "align") == "client/fedcir/align"
    assert ClientResult(0, 1, {}).metrics == {}  # results built without it (older code) carry none


class NormAndDropout(ModelSpec):
    """Flatten → Linear → BatchNorm1d → ReLU → Dropout → Linear: training moves buffers and draws from torch's RNG."""

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return SequentialClassifier(
            nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, num_classes)
        )


class ProbingClient(ClientModule):
    """A probe that does everything the loop must undo: draws random numbers, runs the model in training mode
    (BatchNorm statistics move) and differentiates it. It records when and where it ran."""

    calls: list[dict] = []

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        weights = {k: v.clone() for k, v in self.model.state_dict().items()}
        torch.randn(100)
        loss = F.cross_entropy(self.model(x + torch.randn_like(x)), y)
        grads = torch.autograd.grad(loss, [p for p in self.model.parameters() if p.requires_grad])
        ProbingClient.calls.append(
            {"steps": getattr(self, "steps", 0), "batch": len(y), "weights": weights, "norm": float(grads[0].norm())}
        )

    def local_loss(self, x: torch.Tensor, y: torch.Tensor):
        self.steps = getattr(self, "steps", 0) + 1  # one call per step
        return super().local_loss(x, y)

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        return {"norm": ProbingClient.calls[-1]["norm"]}


class Probing(FedAvg):
    client_module = ProbingClient


@pytest.mark.parametrize("loop", ["lean", "standard"])
def test_the_probe_runs_once_per_fit_and_leaves_the_training_unchanged(loop):
    """Bit for bit the fit of a client without the probe (weights, BatchNorm buffers, loss, dropout masks drawn from
    torch's RNG); the probe ran once, before the first step, at the fit's starting weights, on a full first batch."""
    data = UCIDigitsDomains(domains=("clean",), clients_per_domain=1).build(seed=1)
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, loop=loop)
    results = {}
    for method in (FedAvg(), Probing()):
        env = ClientEnvironment(data, NormAndDropout(), HyperParameters(method), local, seed=0)
        torch.manual_seed(0)
        start = env.build_model().state_dict()
        ProbingClient.calls = []
        results[type(method).__name__] = run_client(env, ClientTask(1, 0, 5, start))
    plain, probed = results["FedAvg"], results["Probing"]
    (call,) = ProbingClient.calls
    assert call["steps"] == 0 and call["batch"] == 16 and probed.metrics == {"norm": call["norm"]} and call["norm"] > 0
    assert all(torch.equal(call["weights"][k], start[k]) for k in start)
    assert any("running_mean" in k for k in plain.weights)
    assert plain.weights.keys() == probed.weights.keys() and all(
        torch.equal(plain.weights[k], probed.weights[k]) for k in plain.weights
    )
    assert plain.train_loss == probed.train_loss and plain.num_steps == probed.num_steps
