"""Baseline FL methods: reductions to FedAvg, the extra terms really wired in, hand computations, drift, resume,
and composition with GGEUR."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flsuite.data.base import ClientData, DataSource, FederatedData, Split
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.executors import SerialExecutor
from flsuite.federation.task import ClientResult, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.feddyn import FedDyn
from flsuite.methods.fedntd import FedNTD, not_true_logits, ntd_loss
from flsuite.methods.fedopt import FedOpt
from flsuite.methods.fedproto import FedProto
from flsuite.methods.fedprox import FedProx
from flsuite.methods.ggeur import GGEUR
from flsuite.methods.moon import MOON
from flsuite.methods.scaffold import Scaffold, effective_steps
from flsuite.models.heads import MLP, Linear
from flsuite.models.representation import forward_with_representation, logits_as_representation
from tests.helpers import head_federation, initial_weights


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir).global_weights


def same_weights(a, b, atol: float = 0.0) -> bool:
    return a.keys() == b.keys() and all(
        torch.allclose(a[k], b[k], rtol=0, atol=atol) if atol else torch.equal(a[k], b[k]) for k in a
    )


def history(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recording(SerialExecutor):
    """Keeps a copy of every client result."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[ClientResult] = []

    def run(self, tasks):
        results = super().run(tasks)
        self.results.extend(copy.deepcopy(results))
        return results


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    """FedAvg on the standard tiny federation (2 rounds), the reference of every reduction test."""
    run_dir = tmp_path_factory.mktemp("fedavg")
    head_federation(run_dir, rounds=2).fit()
    return run_dir


# ---- reductions to FedAvg and non-reductions -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("zero", "nonzero"),
    [
        (FedProx(mu=0.0), FedProx(mu=1.0)),
        (MOON(mu=0.0), MOON(mu=5.0)),
        (FedProto(lam=0.0), FedProto(lam=5.0)),
        (FedNTD(beta=0.0), FedNTD(beta=5.0)),
    ],
    ids=["fedprox", "moon", "fedproto", "fedntd"],
)
def test_zero_coefficient_reproduces_fedavg_exactly(tmp_path, fedavg_run, zero, nonzero):
    """Term = 0: identical metrics (byte-identical file, except FedProto's bytes_up/down, which count the
    prototypes it sends) and identical global weights (torch.equal); term > 0: the global weights differ."""
    head_federation(tmp_path / "zero", rounds=2, method=zero).fit()
    if isinstance(zero, FedProto):
        strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("bytes_")} for r in h]  # noqa: E731
        assert strip(history(tmp_path / "zero")) == strip(history(fedavg_run))
        assert history(tmp_path / "zero")[1]["bytes_up"] > history(fedavg_run)[1]["bytes_up"]
    else:
        assert (tmp_path / "zero" / "metrics.jsonl").read_bytes() == (fedavg_run / "metrics.jsonl").read_bytes()
    assert same_weights(final_weights(tmp_path / "zero"), final_weights(fedavg_run))
    head_federation(tmp_path / "nonzero", rounds=2, method=nonzero).fit()
    assert not same_weights(final_weights(tmp_path / "nonzero"), final_weights(fedavg_run), atol=1e-4)


def test_fedopt_server_sgd_lr1_is_fedavg(tmp_path, fedavg_run):
    """x − 1·(x − avg) = avg: computed in float64 from float32 values, this is exact (so torch.equal holds)."""
    head_federation(tmp_path / "sgd1", rounds=2, method=FedOpt(server="sgd", server_lr=1.0, momentum=0.0)).fit()
    assert same_weights(final_weights(tmp_path / "sgd1"), final_weights(fedavg_run))
    ours, ref = history(tmp_path / "sgd1"), history(fedavg_run)
    for a, b in zip(ours, ref):
        assert {k: v for k, v in a.items() if not k.startswith("server/")} == b
    head_federation(tmp_path / "sgd05", rounds=2, method=FedOpt()).fit()
    assert not same_weights(final_weights(tmp_path / "sgd05"), final_weights(fedavg_run), atol=1e-4)


@pytest.mark.parametrize("server", ["adam", "yogi"])
def test_fedopt_adaptive_servers_keep_checkpointed_moments(tmp_path, server):
    head_federation(tmp_path, rounds=2, method=FedOpt(server=server, server_lr=0.05)).fit()
    state = load_checkpoint(tmp_path).server_state
    assert set(state["m"]) == set(state["v"]) == {"1.weight", "1.bias"}
    assert all(torch.isfinite(v).all() and (v > 0).all() for v in state["v"].values())


def test_fedopt_first_adam_step_matches_hand_computation():
    """Round 1 from m = 0, v = τ²: m = (1−β1)Δ, v = β2τ² + (1−β2)Δ², x ← x − η m/(√v + τ)."""
    method = FedOpt(server="adam", server_lr=0.5)
    model = torch.nn.Linear(2, 1)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    client = {k: v + 0.3 for k, v in start.items()}
    results = [ClientResult(client_id=0, num_samples=5, weights=client)]
    method.setup(model, num_clients=1)
    state = method.init_server_state(start)
    new, state = method.aggregate(1, start, results, state)
    model.load_state_dict(new)
    delta = torch.full_like(start["weight"], -0.3)
    m, v = 0.1 * delta, 0.99 * 1e-6 + 0.01 * delta**2
    torch.testing.assert_close(model.weight.detach(), start["weight"] - 0.5 * m / (v.sqrt() + 1e-3))


# ---- SCAFFOLD --------------------------------------------------------------------------------------------------
SGD = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)


def test_scaffold_control_variates_after_one_full_round(tmp_path):
    rec = Recording()
    head_federation(tmp_path, rounds=1, local=SGD, method=Scaffold(), executor=rec).fit()
    ckpt = load_checkpoint(tmp_path)
    c = ckpt.server_state["c"]
    assert set(c) == {"1.weight", "1.bias"}
    c_is = [ckpt.client_states[k]["c_i"] for k in sorted(ckpt.client_states)]
    for name in c:
        assert c[name].abs().sum() > 0  # control variates changed from zero
        torch.testing.assert_close(c[name], torch.stack([ci[name] for ci in c_is]).mean(0), rtol=0, atol=1e-7)
    # c_i⁺ = (x − y)/(K η_l) from c = c_i = 0: one client by hand; y = x + Δy (its weights never leave it)
    r = rec.results[0]
    assert r.weights == {}  # a linear head has no buffers: nothing but the upload travels
    expected = -r.upload["delta_y"]["1.weight"] / (r.num_steps * SGD.lr)
    torch.testing.assert_close(r.state["c_i"]["1.weight"], expected, rtol=0, atol=1e-6)


def test_scaffold_round_one_with_unit_server_lr_is_uniform_fedavg(tmp_path):
    head_federation(tmp_path / "s", rounds=1, local=SGD, method=Scaffold(server_lr=1.0)).fit()
    head_federation(tmp_path / "a", rounds=1, local=SGD, method=FedAvg(weighting="uniform")).fit()
    assert same_weights(final_weights(tmp_path / "s"), final_weights(tmp_path / "a"), atol=1e-6)
    # round 2 uses the (now non-zero) control variates: the runs part
    head_federation(tmp_path / "s2", rounds=2, local=SGD, method=Scaffold(server_lr=1.0)).fit()
    head_federation(tmp_path / "a2", rounds=2, local=SGD, method=FedAvg(weighting="uniform")).fit()
    assert not same_weights(final_weights(tmp_path / "s2"), final_weights(tmp_path / "a2"), atol=1e-4)


def test_scaffold_round_two_step_is_x_minus_lr_times_gradient_minus_c_k_plus_c_by_hand(tmp_path):
    """One full-batch SGD step per client in round 2, from round 1's c and c_k (both non-zero, unequal):
    y_k = x − η_l (∇L_k(x) − c_k + c), with ∇L_k the client's mean cross-entropy gradient at the round's x."""
    one_step = LocalTraining(epochs=1, batch_size=60, lr=0.05, momentum=0.0, weight_decay=0.0)  # 60 samples a client
    head_federation(tmp_path / "r1", rounds=1, local=one_step, method=Scaffold()).fit()
    after_one = load_checkpoint(tmp_path / "r1")
    rec = Recording()
    fed = head_federation(tmp_path / "r2", rounds=2, local=one_step, method=Scaffold(), executor=rec)
    fed.fit()
    data = fed.build_data()[0]
    c, x = after_one.server_state["c"], after_one.global_weights
    round_two = rec.results[len(data.clients) :]
    assert sorted(r.client_id for r in round_two) == list(range(len(data.clients)))
    for r in round_two:
        c_k = after_one.client_states[r.client_id]["c_i"]
        assert (c["1.weight"] - c_k["1.weight"]).abs().max() > 1e-3  # the correction's sign matters here
        model = fed.model.build(data.input_shape, data.num_classes)
        model.load_state_dict(x)
        train = data.clients[r.client_id].train
        F.cross_entropy(model(train.x), train.y).backward()
        for name, p in model.named_parameters():
            expected = x[name] - one_step.lr * (p.grad - c_k[name] + c[name])
            torch.testing.assert_close(x[name] + r.upload["delta_y"][name], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("steps", [1, 7, 300])
def test_effective_steps_is_the_displacement_of_momentum_sgd_on_a_constant_gradient(steps, momentum):
    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    opt = torch.optim.SGD([w], lr=0.1, momentum=momentum)
    for _ in range(steps):
        opt.zero_grad()
        (w @ g).backward()
        opt.step()
    torch.testing.assert_close(-w.detach() / (0.1 * effective_steps(steps, momentum)), g, rtol=1e-10, atol=0)


def test_scaffold_control_variates_with_momentum_use_effective_steps(tmp_path):
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=0.0)
    for flag in (True, False):
        rec = Recording()
        fed = head_federation(
            tmp_path / str(flag), rounds=1, local=local, method=Scaffold(effective_steps=flag), executor=rec
        )
        fed.fit()
        r = rec.results[0]
        steps = effective_steps(r.num_steps, 0.9) if flag else r.num_steps
        expected = -r.upload["delta_y"]["1.weight"] / (steps * local.lr)
        torch.testing.assert_close(r.state["c_i"]["1.weight"], expected, rtol=0, atol=1e-6)
    assert effective_steps(r.num_steps, 0.9) > 3 * r.num_steps  # the textbook divisor K inflates c_i > 3x here


# ---- FedDyn ----------------------------------------------------------------------------------------------------
def test_feddyn_server_state_matches_hand_computation(tmp_path):
    data = GaussianFeatures(
        dim=4, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=30, test_per_domain=20
    )
    rec = Recording()
    alpha = 0.5
    fed = head_federation(tmp_path, data=data, rounds=1, method=FedDyn(alpha=alpha), executor=rec)
    x = initial_weights(fed)
    fed.fit()
    ckpt = load_checkpoint(tmp_path)
    w0, w1 = (r.weights for r in rec.results)
    for name in ("1.weight", "1.bias"):
        h = -alpha * ((w0[name] - x[name]) + (w1[name] - x[name])) / 2
        torch.testing.assert_close(ckpt.server_state["h"][name], h, rtol=0, atol=1e-6)
        torch.testing.assert_close(ckpt.global_weights[name], (w0[name] + w1[name]) / 2 - h / alpha, rtol=0, atol=1e-6)
        # client state ∇L_k ← 0 − α(θ_k − θ)
        torch.testing.assert_close(
            ckpt.client_states[0]["grad"][name], -alpha * (w0[name] - x[name]), rtol=0, atol=1e-6
        )


# ---- drift: SCAFFOLD and FedDyn fix what FedAvg cannot --------------------------------------------------------
class DriftToy(DataSource):
    """2 clients, logistic regression in 2-d with opposite feature scales and different label rules: many local
    steps make FedAvg settle at the average of the local optima, not at the optimum of the sum."""

    def build(self, seed: int) -> FederatedData:
        g = torch.Generator().manual_seed(seed)
        clients = []
        for k, (scale, w) in enumerate([((3.0, 0.3), (1.0, -2.0)), ((0.3, 3.0), (-2.0, 1.0))]):
            x = torch.randn(200, 2, generator=g) * torch.tensor(scale)
            y = torch.bernoulli(torch.sigmoid(x @ torch.tensor(w) + 1.0), generator=g).long()
            clients.append(ClientData(k, f"d{k}", Split(x, y)))
        return FederatedData(clients, {c.domain: c.train for c in clients}, num_classes=2)


def global_train_loss(run_dir, data: FederatedData) -> float:
    w = final_weights(run_dir)
    x = torch.cat([c.train.x for c in data.clients])
    y = torch.cat([c.train.y for c in data.clients])
    return float(F.cross_entropy(x @ w["1.weight"].T + w["1.bias"], y))


def test_scaffold_and_feddyn_beat_fedavg_under_client_drift(tmp_path):
    local = LocalTraining(steps=60, batch_size=16, lr=0.3, momentum=0.0, weight_decay=0.0)
    data = DriftToy().build(0)
    losses = {}
    for name, method in [("fedavg", FedAvg()), ("scaffold", Scaffold(server_lr=1.0)), ("feddyn", FedDyn(alpha=0.5))]:
        head_federation(tmp_path / name, data=DriftToy(), seed=0, rounds=3, local=local, method=method).fit()
        losses[name] = global_train_loss(tmp_path / name, data)
    assert losses["scaffold"] < losses["fedavg"] - 0.03, losses
    assert losses["feddyn"] < losses["fedavg"] - 0.03, losses


# ---- checkpoint/resume, composition, deeper models ------------------------------------------------------------
def test_scaffold_resume_after_kill_equals_uninterrupted_run(tmp_path):
    from flsuite.federation.sampling import ClientSampling
    from tests.helpers import killed_and_resumed

    a, b = killed_and_resumed(
        tmp_path, 3, rounds=4, local=SGD, sampling=ClientSampling(fraction=0.5), method=Scaffold()
    )
    assert same_weights(a.global_weights, b.global_weights)
    assert same_weights(a.server_state["c"], b.server_state["c"])
    for k in a.client_states:
        assert same_weights(a.client_states[k]["c_i"], b.client_states[k]["c_i"])


def test_scaffold_composes_with_ggeur_by_config(tmp_path):
    data = GaussianFeatures(
        dim=6, num_classes=3, num_domains=2, clients_per_domain=1, samples_per_client=30, test_per_domain=30
    )
    setup = [GGEUR(target_per_class=40, samples_per_prototype=10)]
    summary = head_federation(tmp_path, data=data, rounds=2, setup=setup, method=Scaffold()).fit()
    assert summary["last/acc_mean"] > 70  # 3 classes: chance is 33.3; a run that learned nothing stays near it
    stats = json.loads((tmp_path / "partition.json").read_text())
    assert [c["num_samples"] for c in stats["clients"]] == [3 * 40 + 3 * 10] * 2
    assert load_checkpoint(tmp_path).server_state["c"]


def test_representation_is_logits_for_a_linear_head_and_the_last_linear_input_otherwise():
    linear = Linear().build((5,), 3)
    assert logits_as_representation(linear)
    x = torch.randn(4, 5)
    logits, z = forward_with_representation(linear, x, logits_as_representation(linear))
    assert torch.equal(z, logits) and torch.equal(logits, linear(x))
    mlp = MLP(hidden=(7,)).build((5,), 3)
    assert not logits_as_representation(mlp)
    logits, z = forward_with_representation(mlp, x, logits_as_representation(mlp))
    assert z.shape == (4, 7) and torch.equal(z, mlp[:-1](x)) and torch.equal(logits, mlp(x))


@pytest.mark.parametrize("method", [MOON(), FedProto(), FedNTD(), FedDyn(), FedOpt(server="yogi"), FedProx()])
def test_methods_run_on_a_hidden_layer_model(tmp_path, method):
    """Two rounds with an MLP (the hook path for MOON/FedProto); weights stay finite, client state checkpoints."""
    head_federation(tmp_path, rounds=2, model=MLP(hidden=(6,)), method=method).fit()
    ckpt = load_checkpoint(tmp_path)
    assert all(torch.isfinite(v).all() for v in ckpt.global_weights.values())


def test_fedproto_global_prototypes_are_count_weighted_means():
    method = FedProto()
    ups = [
        {"protos": torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "counts": torch.tensor([3, 0])},
        {"protos": torch.tensor([[3.0, 4.0], [2.0, 2.0]]), "counts": torch.tensor([1, 5])},
    ]
    results = [ClientResult(k, 10, {"w": torch.zeros(1)}, upload=u) for k, u in enumerate(ups)]
    _, state = method.aggregate(1, {"w": torch.zeros(1)}, results, {})
    torch.testing.assert_close(state["protos"], torch.tensor([[1.5, 1.0], [2.0, 2.0]]))
    assert state["has"].tolist() == [True, True]
    # a round where nobody holds class 1 keeps its old prototype
    results = [
        ClientResult(
            0,
            10,
            {"w": torch.zeros(1)},
            upload={"protos": torch.tensor([[0.0, 0.0], [9.0, 9.0]]), "counts": torch.tensor([2, 0])},
        )
    ]
    _, state = method.aggregate(2, {"w": torch.zeros(1)}, results, state)
    torch.testing.assert_close(state["protos"], torch.tensor([[0.0, 0.0], [2.0, 2.0]]))


def test_ntd_loss_ignores_the_true_class_and_vanishes_for_equal_not_true_logits():
    y = torch.tensor([0, 2])
    local = torch.tensor([[5.0, 1.0, 2.0], [0.3, -1.0, 7.0]])
    glob = torch.tensor([[-9.0, 1.0, 2.0], [0.3, -1.0, -4.0]])  # differs only at the true classes
    assert float(ntd_loss(local, glob, y, tau=1.0)) == pytest.approx(0.0, abs=1e-7)
    glob[0, 1] = 3.0
    assert float(ntd_loss(local, glob, y, tau=1.0)) > 0.01


def test_not_true_logits_are_the_masked_logits_in_class_order_with_the_same_gradients():
    """The gather gives boolean-mask indexing's values and gradients to the bit (a selection: nothing is summed)."""
    torch.manual_seed(0)
    logits, y = torch.randn(16, 10, requires_grad=True), torch.randint(0, 10, (16,))
    masked = logits[torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)].view(16, 9)
    gathered = not_true_logits(logits, y)
    assert torch.equal(gathered, masked)
    assert torch.equal(
        not_true_logits(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), torch.tensor([2])), torch.tensor([[0.0, 1.0, 3.0]])
    )
    weights = torch.randn(16, 9)
    (from_mask,) = torch.autograd.grad((masked * weights).sum(), logits)
    (from_gather,) = torch.autograd.grad((gathered * weights).sum(), logits)
    assert torch.equal(from_gather, from_mask)


OVERLAYS = sorted((Path(__file__).resolve().parents[2] / "configs" / "baselines").glob("*.yaml"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_config_overlays_parse(tmp_path, capsys, overlay):
    import yaml

    from flsuite.cli import main

    base = tmp_path / "base.yaml"
    base.write_text(
        "rounds: 1\ndata: {class_path: flsuite.data.builtin.GaussianFeatures}\nmodel: "
        "{class_path: flsuite.models.heads.Linear}\n"
    )
    try:
        code = main(["fit", "--config", str(base), "--config", str(overlay), "--print_config"])
    except SystemExit as exit_info:  # jsonargparse may exit after printing
        code = exit_info.code
    assert code in (0, None)
    method = yaml.safe_load(capsys.readouterr().out)["method"]
    expected = yaml.safe_load(overlay.read_text())["method"]
    assert method["class_path"] == expected["class_path"]
    applied = method.get("init_args", {})
    assert applied | expected.get("init_args", {}) == applied  # every overlay value was applied


@pytest.mark.parametrize(
    "method",
    [FedAvg(), FedProx(mu=0.0), FedProx(mu=5.0), FedDyn(alpha=0.5), MOON(mu=5.0), FedNTD(beta=5.0)],
    ids=[
        "fedavg",
        "fedprox-mu0",
        "fedprox-mu5",
        "feddyn",
        "moon",
        "fedntd",
    ],  # stable ids: xdist workers must collect the same names
)
def test_the_task_loss_is_the_cross_entropy_without_the_methods_terms(tmp_path, method):
    """`ClientResult.task_loss`: the mean cross-entropy over the fit's steps. FedAvg adds nothing (the train loss to
    the bit); FedProx at μ = 0 adds a zero term (equal up to the order of the float64 sums); a positive term makes
    the objective the larger from the second step on (FedDyn's linear term can take either sign: only its
    difference is asserted), and the task loss is still a cross-entropy: positive."""
    rec = Recording()
    head_federation(tmp_path, rounds=2, model=MLP(hidden=(6,)), method=method, executor=rec).fit()
    later = rec.results[4:]  # round 2: away from the global weights, so every term is non-zero
    assert all(r.task_loss > 0 for r in rec.results)
    if isinstance(method, FedProx) and method.mu == 0.0:
        assert all(r.task_loss == pytest.approx(r.train_loss, rel=1e-12) for r in rec.results)
    elif type(method) is FedAvg:
        assert all(r.task_loss == r.train_loss for r in rec.results)
    elif isinstance(method, FedDyn):
        assert all(abs(r.train_loss - r.task_loss) > 1e-6 for r in later)
    else:
        assert all(r.train_loss > r.task_loss + 1e-6 for r in later)


def test_fedprotos_masked_mse_is_the_mse_over_the_masked_rows():
    """`masked_mse` (no data-dependent shape, so the compiled loop can scan it) against boolean indexing; no row: 0."""
    from flsuite.methods.fedproto import masked_mse

    torch.manual_seed(0)
    z, target = torch.randn(6, 4), torch.randn(6, 4)
    mask = torch.tensor([True, False, True, True, False, False])
    torch.testing.assert_close(masked_mse(z, target, mask), F.mse_loss(z[mask], target[mask]), rtol=1e-6, atol=0)
    assert masked_mse(z, target, torch.zeros(6, dtype=torch.bool)).item() == 0.0
