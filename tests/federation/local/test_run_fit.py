"""The lean and compiled loops on the CPU run without a Trainer (`flsuite.federation.local.loops.run_fit`): the same
results to the bit as `Trainer.fit` of a `LocalFit`, the client's hooks in the same order, and no Trainer built."""

from __future__ import annotations

from typing import ClassVar

import lightning as L
import pytest
import torch

from flsuite.data.base import EpochBatches
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation import server as server_module
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local import client as client_module
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.server import RoundServer
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import MLP
from flsuite.seeding import torch_generator


class Recording(ClientModule):
    """FedAvg's client that logs every hook call with what the loop told it (device, epochs, epoch, steps)."""

    step_hooks = True
    log: ClassVar[list[tuple]] = []

    def begin(self) -> None:
        Recording.log.append(("begin", str(self.device), self.epochs))

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        Recording.log.append(("probe", tuple(x.shape)))

    def before_optimizer_step(self) -> None:
        Recording.log.append(("before", self.epoch, torch.is_grad_enabled()))

    def after_optimizer_step(self) -> None:
        Recording.log.append(("after", self.epoch))

    def end(self, fit: FitStatistics) -> None:
        Recording.log.append(("end", fit.num_steps))


class RecordingFedAvg(FedAvg):
    client_module = Recording


LOCALS = {
    "sgd, 3 epochs": LocalTraining(epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3, loop="lean"),
    "adam, 7 steps": LocalTraining(steps=7, batch_size=8, lr=0.01, optimizer="adam", loop="lean"),
}


def fits(local: LocalTraining) -> tuple[list, list[tuple]]:
    """Two clients' fits (an MLP head with dropout: the task seed's global stream) from the same global weights, under
    no_grad (as a caller may be), and the hook log."""
    data = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=44).build(
        seed=1
    )
    env = ClientEnvironment(data, MLP(hidden=(5,), dropout=0.3), HyperParameters(RecordingFedAvg()), local, seed=0)
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    Recording.log = []
    with torch.no_grad():
        results = [run_client(env, ClientTask(1, k, 10 + k, weights)) for k in range(2)]
    return results, Recording.log


def through_the_trainer(monkeypatch) -> None:
    """Every fit through `Trainer.fit` of a `LocalFit`, as before `run_fit`."""
    monkeypatch.setattr(client_module, "runs_without_a_trainer", lambda *settings: False)
    monkeypatch.setattr(server_module, "runs_without_a_trainer", lambda *settings: False)


@pytest.mark.parametrize("name", list(LOCALS))
def test_run_fit_equals_trainer_fit_to_the_bit_with_the_hooks_in_the_same_order(name, monkeypatch):
    direct, direct_log = fits(LOCALS[name])
    through_the_trainer(monkeypatch)
    trainer, trainer_log = fits(LOCALS[name])
    assert direct_log == trainer_log
    steps = 18 if "epochs" in name else 7
    assert direct_log[:2] == [("begin", "cpu", 3 if "epochs" in name else 1), ("probe", (8, 6))]
    assert direct_log.count(("end", steps)) == 2
    assert all(entry[2] for entry in direct_log if entry[0] == "before")  # gradients on, whatever the caller's mode
    for a, b in zip(direct, trainer, strict=True):
        assert (a.num_steps, a.train_loss, a.task_loss) == (b.num_steps, b.train_loss, b.task_loss)
        assert a.num_steps == steps
        assert all(torch.equal(a.weights[k], b.weights[k]) for k in b.weights)


def test_a_lean_cpu_fit_builds_no_trainer_and_the_standard_loop_still_does(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("a Trainer was built")

    monkeypatch.setattr(L.Trainer, "__init__", refuse)
    results, _ = fits(LOCALS["sgd, 3 epochs"])
    assert [r.num_steps for r in results] == [18, 18]
    with pytest.raises(AssertionError, match="a Trainer was built"):
        fits(LocalTraining(epochs=1, batch_size=8, lr=0.1, loop="standard"))


def test_the_servers_supervised_fit_equals_its_trainer_fit(monkeypatch):
    """`RoundServer.train` (FKPL's head, ServerFinetune, ...) on the CPU runs without a Trainer, to the same bits (its
    dropout drawn from the server stream of `purpose`, as before)."""
    data = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=60).build(0)

    def train(global_seed: int = 0) -> tuple[FitStatistics, dict[str, torch.Tensor]]:
        torch.manual_seed(3)
        server = RoundServer(
            round=2, seed=5, results=[], num_clients=1, build_model=lambda: MLP(hidden=(4,), dropout=0.3).build((6,), 3)
        )
        model = server.build_model()
        batches = EpochBatches(data.clients[0].train, 16, torch_generator(0, purpose="t"), epochs=4)
        local = LocalTraining(batch_size=16, lr=0.05, momentum=0.9)
        torch.manual_seed(global_seed)  # whatever the process's RNG holds, the fit's dropout is the server stream's
        stats = server.train(model, batches, local, purpose="head")
        return stats, model.state_dict()

    (direct, w_direct), (moved, w_moved) = train(), train(global_seed=1)
    assert direct.mean_loss == moved.mean_loss and all(torch.equal(w_direct[k], w_moved[k]) for k in w_direct)
    (through, w_through) = (through_the_trainer(monkeypatch), train())[1]
    assert (direct.num_steps, direct.mean_loss) == (through.num_steps, through.mean_loss) and direct.num_steps == 16
    assert all(torch.equal(w_direct[k], w_through[k]) for k in w_through)


WORKER = """
import sys
import torch
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import HyperParameters
from flsuite.federation.ray_workers import ClientWorker  # what a Ray worker process imports
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import MLP
data = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=20).build(0)
env = ClientEnvironment(data, MLP(hidden=(5,)), HyperParameters(FedAvg()), LocalTraining(epochs=2, batch_size=8), 0)
result = run_client(env, ClientTask(1, 0, 3, env.build_model().state_dict()))
print(result.num_steps, sorted(m for m in ("lightning", "torchmetrics") if m in sys.modules))
"""


def test_a_process_that_runs_lean_client_fits_imports_no_lightning():
    """A Ray worker's module and a lean client fit on the CPU import neither Lightning nor torchmetrics (~1.5 s of a
    worker's start here), so a worker, or any process that only trains clients, does not pay for them."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", WORKER], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "6 []", done.stdout
