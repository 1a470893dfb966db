"""The lean loop's wrapper-free SGD step (flsuite.federation.local.sgd) gives `optimizer.step()`'s results to the
bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.local import loops
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.local.sgd import grad_clearer, is_wrapper_free_sgd, optimizer_step
from flsuite.federation.method import HyperParameters
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP
from tests.helpers import head_federation


def torch_step(optimizer, fused=False):
    assert not fused  # the lean loop never asks for the fused update
    return optimizer.step


def torch_zero_grad(optimizer):
    return lambda: optimizer.zero_grad(set_to_none=True)


@pytest.fixture
def through_torch(monkeypatch):
    """Make the lean loop call `optimizer.zero_grad(set_to_none=True)` and `optimizer.step()` as before."""

    def use() -> None:
        monkeypatch.setattr(loops, "optimizer_step", torch_step)
        monkeypatch.setattr(loops, "grad_clearer", torch_zero_grad)

    return use


LOCALS = {
    "plain sgd": LocalTraining(epochs=3, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0.0),
    "momentum + weight decay": LocalTraining(epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam (falls back)": LocalTraining(epochs=3, batch_size=8, lr=0.01, optimizer="adam", weight_decay=1e-3),
}


def client_fits(local: LocalTraining) -> list:
    """Two clients' fits of an MLP head (two layers: four parameters) from the same global weights."""
    data = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=44).build(
        seed=1
    )
    env = ClientEnvironment(data, MLP(hidden=(5,)), HyperParameters(FedAvg()), local, seed=0)
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    return [run_client(env, ClientTask(1, k, 10 + k, weights)) for k in range(2)]


@pytest.mark.parametrize("name", list(LOCALS))
def test_client_fits_equal_those_through_optimizer_step(name, through_torch):
    fast = client_fits(LOCALS[name])
    through_torch()
    reference = client_fits(LOCALS[name])
    for a, b in zip(fast, reference):
        assert a.num_steps == b.num_steps == 18
        assert a.train_loss == b.train_loss
        assert a.weights.keys() == b.weights.keys()
        assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert not torch.equal(fast[0].weights["1.weight"], fast[1].weights["1.weight"])


def test_the_lean_loop_takes_the_fast_path_for_sgd(monkeypatch):
    def refuse(self, closure=None):
        raise AssertionError("SGD.step called")

    monkeypatch.setattr(torch.optim.SGD, "step", refuse)
    client_fits(LOCALS["momentum + weight decay"])  # no AssertionError: step() was never called


def test_a_scaffold_run_is_unchanged(tmp_path, through_torch):
    """SCAFFOLD corrects the gradients in before_optimizer_step: the step must read them after the hook."""
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.5, weight_decay=1e-4)
    head_federation(tmp_path / "fast", method=Scaffold(), local=local).fit()
    through_torch()
    head_federation(tmp_path / "torch", method=Scaffold(), local=local).fit()
    assert (tmp_path / "fast" / "metrics.jsonl").read_text() == (tmp_path / "torch" / "metrics.jsonl").read_text()


def two_optimizers(**kwargs) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2))
    b = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2))
    b.load_state_dict(a.state_dict())
    return a, torch.optim.SGD(a.parameters(), **kwargs), b, torch.optim.SGD(b.parameters(), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "maximize": True},
    ],
)
def test_the_step_follows_the_groups_and_skips_parameters_without_gradients(kwargs):
    """lr changed between steps, a frozen last layer (no .grad: step() skips it, weight decay included), the
    momentum buffers in optimizer.state as step() keeps them."""
    fast_model, fast, ref_model, ref = two_optimizers(**kwargs)
    assert is_wrapper_free_sgd(fast)
    step, clear = optimizer_step(fast), grad_clearer(fast)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for i in range(4):
        for group in fast.param_groups + ref.param_groups:
            group["lr"] = 0.1 / (i + 1)
        clear()
        ref.zero_grad(set_to_none=True)
        fast_model[:2](x).square().mean().backward()
        ref_model[:2](x).square().mean().backward()
        step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(fast_model.parameters(), ref_model.parameters()))
    assert len(fast.state) == len(ref.state) == (4 if "momentum" in kwargs else 0)
    for p, q in zip(fast_model.parameters(), ref_model.parameters()):
        assert fast.state[p].keys() == ref.state[q].keys()
        if "momentum_buffer" in ref.state[q]:
            assert torch.equal(fast.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])
    assert torch.equal(fast_model[2].weight, ref_model[2].weight) and fast_model[2].weight.grad is None


def test_what_step_would_do_differently_falls_back():
    params = [nn.Parameter(torch.zeros(2))]
    assert is_wrapper_free_sgd(torch.optim.SGD(params, lr=0.1))
    assert not is_wrapper_free_sgd(torch.optim.Adam(params, lr=0.1))
    assert not is_wrapper_free_sgd(torch.optim.SGD(params, lr=0.1, foreach=True))
    assert not is_wrapper_free_sgd(torch.optim.SGD(params, lr=0.1, differentiable=True))

    class MySGD(torch.optim.SGD):
        pass

    assert not is_wrapper_free_sgd(MySGD(params, lr=0.1))
    hooked = torch.optim.SGD(params, lr=0.1)
    handle = hooked.register_step_post_hook(lambda *args: None)
    assert not is_wrapper_free_sgd(hooked)
    assert optimizer_step(hooked) == hooked.step
    handle.remove()
    assert is_wrapper_free_sgd(hooked)
    global_handle = register_optimizer_step_pre_hook(lambda *args: None)
    try:
        assert not is_wrapper_free_sgd(torch.optim.SGD(params, lr=0.1))
    finally:
        global_handle.remove()
    scheduled = torch.optim.SGD(params, lr=0.1)
    torch.optim.lr_scheduler.StepLR(scheduled, step_size=1)  # wraps scheduled.step to count calls
    assert not is_wrapper_free_sgd(scheduled)
