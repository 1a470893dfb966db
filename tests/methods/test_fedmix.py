"""FedMix and NaiveMix: the loss by hand on a tiny batch, λ = 0 is cross-entropy, NaiveMix is explicit mixup with
the pooled means, the derivative term's second-order gradient, the group means and the bytes of both one-shot
exchanges, resume, the quickstart overlay, and the compiled loop."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flsuite.data.base import ClientData, Split
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import HyperParameters
from flsuite.federation.query import QueryTask
from flsuite.federation.task import ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedmix import FedMix, FedMixClient, fedmix_loss, naivemix_loss
from flsuite.methods.fedmix_means import GroupMeans, group_means
from flsuite.models.heads import MLP, Linear, SmallCNN
from tests.federation.test_run import CrashAtRound
from tests.helpers import cnn_federation, head_federation, run_cli

ROOT = Path(__file__).resolve().parents[2]


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def linear(weight: list[list[float]], bias: list[float]) -> torch.nn.Module:
    model = Linear().build((len(weight[0]),), len(weight))
    with torch.no_grad():
        model.head.weight.copy_(torch.tensor(weight))
        model.head.bias.copy_(torch.tensor(bias))
    return model


# ---- the loss ----------------------------------------------------------------------------------------------------
W, B = [[1.0, -2.0], [0.5, 0.0], [-1.0, 1.5]], [0.1, -0.2, 0.0]
X, Y = torch.tensor([[1.0, 2.0], [-0.5, 0.3]]), torch.tensor([0, 2])
XBAR, YBAR = torch.tensor([[0.2, -0.4], [1.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]])


def hand_fedmix(lam: float, norm: str = "sample") -> float:
    """The loss for f(z) = Wz + b, written out: ∂ℓ(f(z), y)/∂z = Wᵀ(softmax(f(z)) − e_y)."""
    w, b, total = torch.tensor(W, dtype=torch.float64), torch.tensor(B, dtype=torch.float64), 0.0
    for i in range(2):
        z = (1 - lam) * X[i].double()
        logits = w @ z + b
        p = torch.exp(logits) / torch.exp(logits).sum()
        ce = -torch.log(p[Y[i]])
        mean_label = -(YBAR[i].double() * torch.log(p)).sum()
        grad = w.T @ (p - F.one_hot(Y[i], 3).double())
        taylor = grad @ XBAR[i].double()
        scale = lam * (1 - lam) / (2 if norm == "batch" else 1)
        total += float((1 - lam) * ce + lam * mean_label + scale * taylor)
    return total / 2


@pytest.mark.parametrize("norm", ["sample", "batch"])
def test_fedmix_loss_equals_a_hand_computation(norm):
    loss, terms = fedmix_loss(linear(W, B), X, Y, XBAR, YBAR, lam=0.2, norm=norm)
    assert loss.item() == pytest.approx(hand_fedmix(0.2, norm), rel=1e-6)
    assert terms["ce"].item() == pytest.approx(F.cross_entropy(linear(W, B)(0.8 * X), Y).item(), rel=1e-6)


def test_fedmix_at_lambda_zero_is_plain_cross_entropy():
    model = MLP(hidden=[5]).build((2,), 3)
    loss, _ = fedmix_loss(model, X, Y, XBAR, YBAR, lam=0.0)
    expected = F.cross_entropy(model(X), Y)
    assert torch.allclose(loss, expected, rtol=1e-6)
    g, h = torch.autograd.grad(loss, list(model.parameters())), torch.autograd.grad(expected, list(model.parameters()))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-8) for a, b in zip(g, h))


def autograd_reference(model, x, y, xbar, ybar, lam):
    """The loss with `torch.autograd.grad(create_graph=True)` (what the reimplementations do, per sample)."""
    z = ((1 - lam) * x).requires_grad_(True)
    log_probs = F.log_softmax(model(z), dim=1)
    ce = -log_probs.gather(1, y[:, None]).squeeze(1)
    (grad,) = torch.autograd.grad(ce.sum(), z, create_graph=True)
    taylor = (grad.flatten(1) * xbar.flatten(1)).sum(1)
    return ((1 - lam) * ce - lam * (ybar * log_probs).sum(1) + lam * (1 - lam) * taylor).mean()


@pytest.mark.parametrize(
    ("spec", "shape"),
    [(MLP(hidden=[6]), (2,)), (SmallCNN(channels=(3,), hidden=5), (1, 4, 4))],
    ids=["mlp", "batchnorm-cnn"],
)
def test_the_derivative_term_is_differentiated_twice_and_buffers_advance_once(spec, shape):
    """The parameters' gradient of the loss is autograd's double backward; BatchNorm's running statistics move as one
    plain forward moves them."""
    torch.manual_seed(0)
    model, x = spec.build(shape, 3).train(), torch.randn(5, *shape)
    y, xbar, ybar = torch.tensor([0, 1, 2, 1, 0]), torch.randn_like(x), F.softmax(torch.randn(5, 3), 1)
    reference = copy.deepcopy(model)
    loss, _ = fedmix_loss(model, x, y, xbar, ybar, lam=0.3)
    expected = autograd_reference(reference, x, y, xbar, ybar, lam=0.3)
    assert torch.allclose(loss, expected, rtol=1e-5)
    for a, b in zip(
        torch.autograd.grad(loss, list(model.parameters())), torch.autograd.grad(expected, list(reference.parameters()))
    ):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    for (name, a), b in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(a, b), name


def test_naivemix_is_explicit_mixup_with_the_means():
    model, lam = MLP(hidden=[4]).build((2,), 3), 0.3
    loss, _ = naivemix_loss(model, X, Y, XBAR, YBAR, lam)
    target = (1 - lam) * F.one_hot(Y, 3).float() + lam * YBAR
    assert torch.allclose(loss, F.cross_entropy(model((1 - lam) * X + lam * XBAR), target), rtol=1e-6)


@pytest.mark.parametrize("variant", ["fedmix", "naivemix"])
def test_the_client_pairs_each_sample_with_a_drawn_mean(variant):
    means = {"x": torch.randn(7, 2), "y": F.softmax(torch.randn(7, 3), 1)}
    method = FedMix(lam=0.1, variant=variant).with_means(means)
    model = Linear().build((2,), 3)
    client = FedMixClient(model, method.client_settings(), LocalTraining(), ClientTask(1, 0, 0, {}))
    client.begin()
    torch.manual_seed(3)
    loss, statistics = client.local_loss(X, Y)
    torch.manual_seed(3)
    j = torch.randint(7, (2,))
    f = fedmix_loss if variant == "fedmix" else naivemix_loss
    expected, terms = f(model, X, Y, means["x"][j], means["y"][j], 0.1)
    assert torch.equal(loss, expected) and torch.equal(statistics[client.TASK_LOSS], terms["ce"])


def test_a_fedmix_without_its_exchange_says_so():
    client = FedMixClient(Linear().build((2,), 3), FedMix().client_settings(), LocalTraining(), ClientTask(1, 0, 0, {}))
    with pytest.raises(RuntimeError, match="no global means"):
        client.begin()


# ---- the exchange --------------------------------------------------------------------------------------------------
def test_group_means_by_hand():
    x, y = torch.arange(14, dtype=torch.float32).view(7, 2), torch.tensor([0, 1, 1, 2, 0, 0, 1])
    order = torch.randperm(7, generator=torch.Generator().manual_seed(5))
    out = group_means(x, y, 3, 3, torch.Generator().manual_seed(5))
    assert out["x"].shape == (2, 2) and out["y"].shape == (2, 3)  # ⌊7/3⌋ groups, the 7th sample left out
    for g in range(2):
        rows = order[3 * g : 3 * g + 3]
        assert torch.allclose(out["x"][g], x[rows].mean(0))
        assert torch.allclose(out["y"][g], torch.stack([F.one_hot(y[r], 3).float() for r in rows]).mean(0))
    whole = group_means(x, y, 3, None, torch.Generator().manual_seed(5))
    assert torch.allclose(whole["x"], x.mean(0, keepdim=True)) and torch.allclose(
        whole["y"], torch.tensor([[3, 3, 1]]) / 7
    )
    client = ClientData(0, "d", Split(x, y))
    assert torch.equal(GroupMeans(3, 3).compute(client, QueryTask(0, 5, GroupMeans(3, 3)), None)["x"], out["x"])


def test_the_exchange_is_counted_once_and_nothing_more_travels_in_the_rounds(tmp_path):
    """4 clients × 60 samples, groups of 10: 6 means a client of 8 + 3 float32 up, all 24 to each of 4 clients down;
    the rounds' bytes are FedAvg's."""
    head_federation(tmp_path / "avg", rounds=2, method=FedAvg()).fit()
    summary = head_federation(tmp_path / "mix", rounds=2, method=FedMix(lam=0.1, mix_group=10)).fit()
    per_mean = (8 + 3) * 4
    assert summary["query/fedmix/means/bytes_up"] == 4 * 6 * per_mean and summary["query/fedmix/means/bytes_down"] == 0
    assert (
        summary["query/fedmix/delivery/bytes_down"] == 4 * 24 * per_mean
        and summary["query/fedmix/delivery/bytes_up"] == 0
    )
    for a, b in zip(records(tmp_path / "avg"), records(tmp_path / "mix")):
        assert (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"])
    assert {"client/fedmix/ce", "client/fedmix/mean_label", "client/fedmix/taylor"} <= set(records(tmp_path / "mix")[0])


@pytest.mark.parametrize("variant", ["fedmix", "naivemix"])
def test_a_killed_run_resumes_to_the_uninterrupted_one_without_asking_again(tmp_path, variant):
    """SmallCNN on the quickstart's UCI digits: killed when round 2 starts, resumed; the means come from the
    checkpoint (asked once, counted once)."""
    kwargs = dict(rounds=2, method=FedMix(lam=0.2, mix_group=5, variant=variant))
    cnn_federation(tmp_path / "full", **kwargs).fit()
    with pytest.raises(KeyboardInterrupt):
        cnn_federation(tmp_path / "killed", executor=CrashAtRound(2), **kwargs).fit()
    summary = cnn_federation(None, **kwargs).fit(resume=tmp_path / "killed")
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    assert summary["query/fedmix/means/calls"] == summary["query/fedmix/delivery/calls"] == 1
    full, resumed = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "killed")
    assert torch.equal(full.answers["fedmix"]["means"].value["x"], resumed.answers["fedmix"]["means"].value["x"])


def test_the_quickstart_overlay_runs(tmp_path, capsys):
    config = [
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        "--config",
        str(ROOT / "configs/baselines/fedmix.yaml"),
    ]
    code, _, err = run_cli(
        [
            "fit",
            *config,
            "--rounds",
            "1",
            "--run_dir",
            str(tmp_path / "run"),
            "--progress",
            "false",
            "--wandb.enabled",
            "false",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["query/fedmix/means/calls"] == 1


@pytest.mark.slow
def test_the_compiled_loop_runs_it_and_matches_lean_at_lambda_zero():
    """λ = 0: the partner draws and the derivative term weigh nothing, so the compiled fit is the lean one up to
    rounding; λ > 0 compiles too (torch.func's pullback, not autograd.grad). A linear model at batch 8 on 40-sample
    clients (5 equal batches an epoch), as tests/federation/local/test_compiled.py's fits: the fewest kernels to
    compile, and the input gradient W^T(softmax - one-hot) still depends on the weights (a second-order term)."""
    means = {"x": torch.randn(4, 6), "y": F.softmax(torch.randn(4, 3), 1)}
    from tests.federation.local.test_compiled import EQUAL, client_fits

    def fits(loop: str, lam: float) -> list:
        return client_fits(loop, FedMix(lam=lam).with_means(means), model=Linear(), data=EQUAL, batch_size=8)

    lean, fast = fits("lean", 0.0), fits("compiled", 0.0)
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)
    assert all(r.num_steps == 15 for r in fits("compiled", 0.2))


def test_the_client_keeps_no_state_between_fits():
    """Two fits of one task in one process (another client's fit between them) are identical: what a Ray worker
    runs next cannot depend on what it ran before."""
    data = head_federation(None).data.build(seed=1)
    method = FedMix(lam=0.2).with_means({"x": torch.randn(3, 8), "y": F.softmax(torch.randn(3, 3), 1)})
    env = ClientEnvironment(
        data, MLP(hidden=[4]), HyperParameters(method), LocalTraining(epochs=1, batch_size=16, lr=0.1), seed=0
    )
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    first = run_client(env, ClientTask(1, 0, 11, weights))
    run_client(env, ClientTask(1, 1, 12, weights))
    again = run_client(env, ClientTask(1, 0, 11, weights))
    assert (
        all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights) and first.metrics == again.metrics
    )
