"""FedGen and FedSR: reductions to FedAvg with their terms at zero, hand-computed client losses, FedGen's per-label
ensemble weights and uploaded label counts, FedSR's per-client or averaged reference Gaussians, its uniform
aggregation and its test-time evaluation (z = μ, or the mean softmax of seeded draws), and what travels."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Independent, Normal, kl_divergence

from flsuite.data.base import Split
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.client import load_task_weights
from flsuite.federation.server import RoundServer
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.federation.transport import Transport
from flsuite.federation.weights import num_bytes
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedgen import FedGen, FedGenClient, decayed
from flsuite.methods.fedsr import REFERENCE, FedSR, FedSRClient, FedSRModel
from flsuite.methods.generator_model import build_generator
from flsuite.metrics import accuracy
from flsuite.models.heads import Linear
from tests.helpers import head_federation
from tests.methods.test_baselines import Recording

SR_MODEL = dict(hidden=[16], dim=8)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("model", "zero", "nonzero"),
    [
        (Linear(), FedGen(alpha=0.0, beta=0.0), FedGen()),
        (
            FedSRModel(**SR_MODEL),
            FedSR(l2r=0.0, cmi=0.0, reference="averaged", weighting="samples"),
            FedSR(l2r=0.1, cmi=0.05),
        ),
    ],
    ids=["fedgen", "fedsr"],
)
def test_terms_at_zero_reproduce_fedavg_exactly(tmp_path, model, zero, nonzero):
    """Byte-identical metrics.jsonl (bytes included: nothing extra travels) and identical weights; terms on differ.
    FedSR in FedAvg's form: references averaged with the weights, weights ∝ samples (its defaults are tested below)."""
    head_federation(tmp_path / "fedavg", rounds=3, model=model, method=FedAvg()).fit()
    head_federation(tmp_path / "zero", rounds=3, model=model, method=zero).fit()
    assert (tmp_path / "zero" / "metrics.jsonl").read_bytes() == (tmp_path / "fedavg" / "metrics.jsonl").read_bytes()
    assert same(load_checkpoint(tmp_path / "zero").global_weights, load_checkpoint(tmp_path / "fedavg").global_weights)
    head_federation(tmp_path / "on", rounds=3, model=model, method=nonzero).fit()
    a, b = load_checkpoint(tmp_path / "on").global_weights, load_checkpoint(tmp_path / "fedavg").global_weights
    assert not all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


def test_fedsr_client_loss_matches_hand_computation():
    """CE(head(μ + σε)) + α_L2R · mean ‖z‖ + α_CMI · mean KL(N(Cμ, Cσ) ‖ N(r_μ(y), softplus(r_σ(y)))), the KL from
    torch.distributions; the reference Gaussians receive gradients through the CMI term."""
    torch.manual_seed(0)
    model = FedSRModel(**SR_MODEL).build((6,), 3).train()
    with torch.no_grad():
        model.r_mu.normal_()
        model.C.fill_(1.5)
    client = FedSRClient(model, FedSR(l2r=0.2, cmi=0.3).client_settings(), LocalTraining(), ClientTask(1, 0, 0, {}))
    client.begin()
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    torch.manual_seed(4)
    loss, statistics = client.local_loss(x, y)
    torch.manual_seed(4)
    mu, sigma = model.encode(x)
    z = mu + sigma * torch.randn_like(mu)
    kl = kl_divergence(
        Independent(Normal(1.5 * mu, 1.5 * sigma), 1),
        Independent(Normal(model.r_mu[y], F.softplus(model.r_sigma)[y]), 1),
    )
    ce = F.cross_entropy(model.fc(z), y)
    expected = ce + 0.2 * z.norm(dim=1).mean() + 0.3 * kl.mean()
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert torch.allclose(statistics[client.TASK_LOSS], ce, rtol=1e-6)  # FedEGG's L^c: the cross-entropy alone
    loss.backward()
    assert model.r_mu.grad is not None and model.r_mu.grad[0].abs().sum() > 0 and model.C.grad is not None


def test_fedsr_cmi_needs_the_reference_gaussians():
    from flsuite.models.probabilistic import ProbabilisticEncoder

    client = FedSRClient(
        ProbabilisticEncoder(**SR_MODEL).build((6,), 3),
        FedSR().client_settings(),
        LocalTraining(),
        ClientTask(1, 0, 0, {}),
    )
    with pytest.raises(TypeError, match="FedSRModel"):
        client.begin()


class RecordingTasks(Recording):
    """Also keeps a copy of every client task (what each client received)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[ClientTask] = []

    def run(self, tasks):
        self.tasks.extend(copy.deepcopy(tasks))
        return super().run(tasks)


def test_fedsr_reference_gaussians_stay_with_each_client(tmp_path):
    """Default `reference: per_client` (the official code): each client trains its own r_μ, r_σ, C from its state;
    they are not in the upload, not averaged, not in what a client receives (the global weights keep W₀'s values,
    which no task carries) and not counted in bytes_up / bytes_down; round 2 starts from the client's round-1 own."""
    executor = RecordingTasks()
    head_federation(
        tmp_path, rounds=2, model=FedSRModel(**SR_MODEL), method=FedSR(l2r=0.1, cmi=0.05), executor=executor
    ).fit()
    initial = {"r_mu": torch.zeros(3, 8), "r_sigma": torch.ones(3, 8), "C": torch.ones(())}
    round1, round2 = executor.results[:4], executor.results[4:]
    for r in executor.results:
        assert not set(REFERENCE) & set(r.weights) and set(r.state["reference"]) == set(REFERENCE)
    for k in REFERENCE:  # trained, and differently on every client
        own = [r.state["reference"][k] for r in round1]
        assert all(not torch.allclose(o, initial[k]) for o in own)
        assert all(not torch.allclose(own[i], own[j]) for i in range(4) for j in range(i))
    for task in executor.tasks:
        assert not set(REFERENCE) & (
            set(task.global_weights) | set(task.held)
        )  # kept on the client: nothing travels down
    previous = {r.client_id: r.state["reference"] for r in round1}
    for task in executor.tasks[4:]:
        assert same(task.state["reference"], previous[task.client_id])
    task = executor.tasks[4]
    model = FedSRModel(**SR_MODEL).build((8,), 3)
    load_task_weights(model, task, Transport(kept=FedSR().kept_on_client()))  # the model's own r_μ, r_σ, C stay
    FedSRClient(
        model, FedSR().client_settings(), LocalTraining(), task
    ).begin()  # the client trains from its own, not the download
    assert same({k: v.detach() for k, v in model.state_dict().items() if k in REFERENCE}, previous[task.client_id])
    assert not same(round2[0].state["reference"], round1[0].state["reference"])  # trained on in round 2
    final = load_checkpoint(tmp_path).global_weights
    assert same({k: final[k] for k in REFERENCE}, initial)
    shared = num_bytes(final) - num_bytes(initial)  # the weights without r_μ, r_σ, C
    assert all(m["bytes_up"] == m["bytes_down"] == 4 * shared for m in metrics(tmp_path))


def test_fedsr_averaged_reference_gaussians_are_the_clients_mean(tmp_path):
    """`reference: averaged` (FL-bench): r_μ, r_σ, C travel with the weights both ways and the server's are the
    (uniform) mean of the clients' uploads."""
    executor = Recording()
    method = FedSR(l2r=0.1, cmi=0.05, reference="averaged")
    head_federation(tmp_path, rounds=1, model=FedSRModel(**SR_MODEL), method=method, executor=executor).fit()
    final = load_checkpoint(tmp_path).global_weights
    for k in REFERENCE:
        uploaded = torch.stack([r.weights[k] for r in executor.results])
        assert not torch.allclose(uploaded[0], uploaded[1])
        torch.testing.assert_close(final[k], uploaded.mean(0), rtol=1e-6, atol=1e-7)
    assert all(r.state == {} for r in executor.results)
    (m,) = metrics(tmp_path)
    assert m["bytes_up"] == m["bytes_down"] == 4 * num_bytes(final)


def test_fedsr_aggregates_uniformly_by_default():
    """The official code's plain mean over clients, whatever their sizes; `weighting: samples` is ∝ n_k."""
    results = [ClientResult(0, 10, {"w": torch.tensor([0.0])}), ClientResult(1, 30, {"w": torch.tensor([4.0])})]
    assert FedSR().aggregate(1, {"w": torch.zeros(1)}, results, {})[0]["w"].item() == 2.0
    assert FedSR(weighting="samples").aggregate(1, {"w": torch.zeros(1)}, results, {})[0]["w"].item() == 3.0


def test_fedsr_evaluation_with_one_sample_is_the_deterministic_forward_at_the_mean():
    """eval_samples = 1: in eval mode the stochastic model is head(μ), the deterministic encoder's forward to the
    bit."""
    torch.manual_seed(0)
    model = FedSRModel(**SR_MODEL, eval_samples=1).build((6,), 3)
    deterministic = FedSRModel(**SR_MODEL, stochastic=False).build((6,), 3)
    deterministic.load_state_dict(model.state_dict())
    x = torch.randn(5, 6)
    model.eval(), deterministic.eval()
    mu, _ = model.encode(x)
    assert torch.equal(model(x), model.fc(mu)) and torch.equal(model(x), deterministic(x))
    assert not torch.allclose(model.train()(x), model.fc(mu))  # training samples z


def test_fedsr_evaluation_is_the_mean_softmax_of_twenty_seeded_draws():
    """Default eval_samples = 20 (the official --num_samples): log((1/S) Σ_s softmax(head(μ + σ ε_s))), ε_s from a
    generator seeded 0 per call, not the global RNG (metrics.jsonl stays reproducible); probabilities, not logits,
    are averaged; the suite's accuracy reads exactly that."""
    torch.manual_seed(0)
    model = FedSRModel(**SR_MODEL).build((6,), 3).eval()
    with torch.no_grad():
        model.stats.bias[8:].fill_(1.0)  # σ ≈ 1.3: draws that move the logits
    x, y = torch.randn(64, 6), torch.randint(3, (64,))
    state = torch.get_rng_state()
    out = model(x)
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(model(x), out)
    mu, sigma = model.encode(x)
    g = torch.Generator().manual_seed(0)
    logits = [model.fc(mu + sigma * torch.randn(mu.shape, generator=g)) for _ in range(20)]
    expected = torch.stack([F.softmax(v, -1) for v in logits]).mean(0).log()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(out, F.log_softmax(torch.stack(logits).mean(0), -1), atol=1e-4)
    assert not torch.allclose(out, F.log_softmax(model.fc(mu), -1), atol=1e-4)
    assert accuracy(model, Split(x, y), 3) == 100.0 * float((expected.argmax(1) == y).float().mean())


def test_fedgen_client_loss_matches_hand_computation():
    """Round 3: CE + α·γ² · CE(h(G(ỹ, ε̃)), ỹ) + β·γ² · KL(softmax(h(G(y, ε))) ‖ softmax(f(x))) (batch mean)."""
    torch.manual_seed(0)
    model = Linear().build((8,), 3)
    gen = build_generator(3, 8, 4, 16, seed=1).eval()
    method = FedGen(alpha=2.0, beta=3.0, decay=0.9, noise_dim=4, hidden=16)
    client = FedGenClient(
        model, method.client_settings(), LocalTraining(), ClientTask(3, 0, 0, {}, {"generator": gen.state_dict()})
    )
    client.begin()
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 0])
    torch.manual_seed(2)
    loss, statistics = client.local_loss(x, y)
    client.gather(statistics)  # what the loops do: the label counts, outside the loss
    torch.manual_seed(2)
    z_y = gen(y, torch.rand(5, 4))
    y_gen = torch.randint(3, (5,))
    z_gen = gen(y_gen, torch.rand(5, 4))
    p, logq = F.softmax(model.head(z_y), 1), F.log_softmax(model(x), 1)
    latent = (p * (p.log() - logq)).sum(1).mean()
    expected = (
        F.cross_entropy(model(x), y) + 2.0 * 0.81 * F.cross_entropy(model.head(z_gen), y_gen) + 3.0 * 0.81 * latent
    )
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert decayed(10.0, 0.98, 1) == 10.0 and decayed(1.0, 0.5, 100) == 1e-4 and decayed(0.0, 0.98, 5) == 0.0
    assert torch.equal(
        client.upload(FitStatistics())["label_counts"], torch.tensor([4, 2, 2])
    )  # count_start 1 + the batch's labels


def test_fedgen_per_label_weights_and_every_head_counts():
    """w_k(y) = n_{k,y} / Σ_k n_{k,y}; labels drawn only from classes some client holds; moving one client's head in
    a way that changes its prediction moves the generator update by far more than rounding."""
    torch.manual_seed(0)
    spec = Linear()
    model = spec.build((8,), 3)
    method = FedGen()
    method.setup(model, 2)
    counts = [torch.tensor([3, 0, 0]), torch.tensor([1, 4, 0])]

    def ctx(move: tuple[torch.Tensor, torch.Tensor] | None = None) -> RoundServer:
        """The round's two uploads (the same heads on every call); `move` = (ΔW, Δb) is added to client 1's head."""
        g = torch.Generator().manual_seed(1)
        heads = [(torch.randn(3, 8, generator=g), torch.zeros(3)) for _ in counts]
        if move is not None:
            heads[1] = (heads[1][0] + move[0], heads[1][1] + move[1])
        results = [
            ClientResult(k, int(c.sum()), {"1.weight": w, "1.bias": b}, {"label_counts": c})
            for k, (c, (w, b)) in enumerate(zip(counts, heads))
        ]
        return RoundServer(2, seed=5, results=results, num_clients=2, build_model=lambda: spec.build((8,), 3))

    c0 = ctx()
    assert torch.allclose(method.ensemble_coefficients(c0.results), torch.tensor([[0.75, 0.0, 0.0], [0.25, 1.0, 0.0]]))
    assert method.generator_labels(c0.results).tolist() == [0, 1]
    # G's first-round initial weights (train_generator draws them from the server stream's "generator/init" seed)
    init = {
        k: p.detach()
        for k, p in build_generator(
            3, 8, method.noise_dim, method.hidden, seed=c0.seed_for("generator/init")
        ).named_parameters()
    }
    ref = method.train_generator(ctx(), {})[0]["generator"]
    # A class-dependent move (seeded ΔW, Δb = (1, −1, 0)) changes client 1's softmax. Adding one constant to all of W
    # would not: every class's logit moves by the same amount, and the two updates differ by rounding only.
    d = torch.Generator().manual_seed(2)
    out = method.train_generator(ctx((torch.randn(3, 8, generator=d), torch.tensor([1.0, -1.0, 0.0]))), {})[0][
        "generator"
    ]
    step = torch.cat([(ref[k] - init[k]).flatten() for k in init])  # the update of G's parameters (BN statistics aside)
    moved = torch.cat([(out[k] - ref[k]).flatten() for k in init])
    # Measured (CPU): ‖moved‖ / ‖step‖ ≈ 0.69 here, ≈ 2e-5 (rounding) for the uniform +0.5 shift, exactly 0 with
    # client 1's head left out of the ensemble; the bound 1e-2 is 500× that rounding level and 1/70 of the move's.
    ratio = float(moved.norm() / step.norm())
    assert ratio > 1e-2, (
        f"moving client 1's head changed G's update by {ratio:.2e} of it (‖update‖ {float(step.norm()):.3e}): "
        "is its head ignored?"
    )


def test_fedgen_uploads_label_counts_and_downloads_the_generator(tmp_path):
    """Counts = 1 + epochs × the client's label histogram; bytes_up adds them, bytes_down adds G from round 2."""
    executor = Recording()
    head_federation(tmp_path, rounds=2, method=FedGen(), executor=executor).fit()
    fed = head_federation(tmp_path / "unused")
    data = fed.data.build(fed.seed)
    for r in executor.results:
        assert torch.equal(
            r.upload["label_counts"], 1 + 2 * torch.bincount(data.clients[r.client_id].train.y, minlength=3)
        )
    r1, r2 = metrics(tmp_path)
    state = load_checkpoint(tmp_path).server_state
    assert r2["bytes_down"] - r1["bytes_down"] == 4 * num_bytes(state["generator"])
    assert r1["bytes_up"] == r2["bytes_up"] == sum(num_bytes(r.weights) + 3 * 8 for r in executor.results[:4])


def _zero_head_context(round: int, counts: list[torch.Tensor]) -> RoundServer:
    results = [
        ClientResult(k, int(c.sum()), {"1.weight": torch.zeros(3, 8), "1.bias": torch.zeros(3)}, {"label_counts": c})
        for k, c in enumerate(counts)
    ]
    return RoundServer(
        round, seed=5, results=results, num_clients=len(counts), build_model=lambda: Linear().build((8,), 3)
    )


def test_fedgen_generator_weight_decay_and_rate_decay_as_the_official_optimizer():
    """With zero heads (no CE gradient) and no diversity loss only Adam's weight decay moves G: each weight steps by
    lr_t · sign(w) per step (Adam's first steps on g = wd · w), lr_t = 3e-4 · 0.98^(t−1); without weight decay G
    stays put. The saved optimiser state carries the round's rate, not round 1's."""
    method = FedGen(diversity=0.0, generator_steps=1, noise_dim=4, hidden=16)
    method.setup(Linear().build((8,), 3), 2)
    counts = [torch.tensor([3, 2, 1]), torch.tensor([1, 4, 2])]
    first, _ = method.train_generator(_zero_head_context(1, counts), {})
    assert (
        first["optimizer"]["param_groups"][0]["lr"] == 3e-4
        and first["optimizer"]["param_groups"][0]["weight_decay"] == 1e-2
    )
    third, _ = method.train_generator(_zero_head_context(3, counts), first)
    lr3 = 3e-4 * 0.98**2
    assert third["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr3, rel=1e-12)
    w_before, w_after = first["generator"]["net.0.weight"], third["generator"]["net.0.weight"]
    # Adam's second step on g = wd·w (w moved by 3e-4 only): m̂/sqrt(v̂) = sign(w) up to ~1e-2 relative, away from 0
    away = w_before.abs() > 1e-2
    assert away.sum() > 90 and torch.allclose(
        w_after[away], (w_before - lr3 * torch.sign(w_before))[away], rtol=0, atol=lr3 * 1e-2
    )
    still = FedGen(diversity=0.0, generator_steps=1, noise_dim=4, hidden=16, generator_weight_decay=0.0)
    still.setup(Linear().build((8,), 3), 2)
    a, _ = still.train_generator(_zero_head_context(1, counts), {})
    b, _ = still.train_generator(_zero_head_context(2, counts), a)
    assert torch.equal(a["generator"]["net.0.weight"], b["generator"]["net.0.weight"])


def test_fedgen_counts_start_at_one_and_the_server_draws_only_counted_labels():
    """The official label_counts start at 1 for every label; labels whose largest count is still that start were never
    seen and are not drawn (MIN_SAMPLES_PER_LABEL); with count_start 0 'seen' means a count > 0."""
    official, plain = FedGen(), FedGen(count_start=0)
    for m in (official, plain):
        m.setup(Linear().build((8,), 3), 2)
    ones = [torch.tensor([4, 1, 1]), torch.tensor([1, 3, 1])]
    assert official.generator_labels(_zero_head_context(1, ones).results).tolist() == [0, 1]
    zeros = [c - 1 for c in ones]
    assert plain.generator_labels(_zero_head_context(1, zeros).results).tolist() == [0, 1]
    assert torch.allclose(
        official.ensemble_coefficients(_zero_head_context(1, ones).results),
        torch.tensor([[0.8, 0.25, 0.5], [0.2, 0.75, 0.5]]),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"generator_lr_decay": 0.0}, "generator_lr_decay"),
        ({"generator_weight_decay": -1.0}, "generator_weight_decay"),
        ({"count_start": -1}, "count_start"),
    ],
)
def test_fedgen_refuses_bad_official_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedGen(**kwargs)


def test_local_lr_decay_is_exponential_per_round_and_off_by_default():
    """lr_t = lr · d^(t−1) · γ^(milestones ≤ t); d = 1 returns lr itself (the old schedule's bits)."""
    local = LocalTraining(lr=0.01, lr_decay=0.99, lr_milestones=[3], lr_gamma=0.5)
    assert [local.lr_at(t) for t in (1, 2, 3)] == pytest.approx([0.01, 0.0099, 0.01 * 0.99**2 * 0.5], rel=1e-12)
    assert LocalTraining(lr=0.03).lr_at(7) == 0.03
    with pytest.raises(ValueError, match="local.lr_decay"):
        LocalTraining(lr_decay=1.5)
