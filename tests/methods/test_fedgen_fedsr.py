"""FedGen and FedSR: reductions to FedAvg with their terms at zero, hand-computed client losses, FedGen's per-label
ensemble weights and uploaded label counts, and what travels."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Independent, Normal, kl_divergence

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.server import ServerContext
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.federation.weights import num_bytes
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedgen import FedGen, FedGenClient, decayed
from flsuite.methods.fedsr import FedSR, FedSRClient, FedSRModel
from flsuite.methods.generators import build_generator
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
    [(Linear(), FedGen(alpha=0.0, beta=0.0), FedGen()), (FedSRModel(**SR_MODEL), FedSR(l2r=0.0, cmi=0.0), FedSR(l2r=0.1, cmi=0.05))],
    ids=["fedgen", "fedsr"],
)
def test_terms_at_zero_reproduce_fedavg_exactly(tmp_path, model, zero, nonzero):
    """Byte-identical metrics.jsonl (bytes included: nothing extra travels) and identical weights; terms on differ."""
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
    client = FedSRClient(model, FedSR(l2r=0.2, cmi=0.3), LocalTraining(), ClientTask(1, 0, 0, {}))
    client.begin()
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    torch.manual_seed(4)
    loss = client.local_loss(x, y)
    torch.manual_seed(4)
    mu, sigma = model.encode(x)
    z = mu + sigma * torch.randn_like(mu)
    kl = kl_divergence(Independent(Normal(1.5 * mu, 1.5 * sigma), 1), Independent(Normal(model.r_mu[y], F.softplus(model.r_sigma)[y]), 1))
    expected = F.cross_entropy(model.fc(z), y) + 0.2 * z.norm(dim=1).mean() + 0.3 * kl.mean()
    assert torch.allclose(loss, expected, rtol=1e-5)
    loss.backward()
    assert model.r_mu.grad is not None and model.r_mu.grad[0].abs().sum() > 0 and model.C.grad is not None


def test_fedsr_cmi_needs_the_reference_gaussians():
    from flsuite.methods.fedcir import ProbabilisticEncoder

    client = FedSRClient(ProbabilisticEncoder(**SR_MODEL).build((6,), 3), FedSR(), LocalTraining(), ClientTask(1, 0, 0, {}))
    with pytest.raises(TypeError, match="FedSRModel"):
        client.begin()


def test_fedgen_client_loss_matches_hand_computation():
    """Round 3: CE + α·γ² · CE(h(G(ỹ, ε̃)), ỹ) + β·γ² · KL(softmax(h(G(y, ε))) ‖ softmax(f(x))) (batch mean)."""
    torch.manual_seed(0)
    model = Linear().build((8,), 3)
    gen = build_generator(3, 8, 4, 16, seed=1).eval()
    method = FedGen(alpha=2.0, beta=3.0, decay=0.9, noise_dim=4, hidden=16)
    client = FedGenClient(model, method, LocalTraining(), ClientTask(3, 0, 0, {}, {"generator": gen.state_dict()}))
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
    expected = F.cross_entropy(model(x), y) + 2.0 * 0.81 * F.cross_entropy(model.head(z_gen), y_gen) + 3.0 * 0.81 * latent
    assert torch.allclose(loss, expected, rtol=1e-5)
    assert decayed(10.0, 0.98, 1) == 10.0 and decayed(1.0, 0.5, 100) == 1e-4 and decayed(0.0, 0.98, 5) == 0.0
    assert torch.equal(client.upload()["label_counts"], torch.tensor([3, 1, 1]))


def test_fedgen_per_label_weights_and_every_head_counts():
    """w_k(y) = n_{k,y} / Σ_k n_{k,y}; labels drawn only from classes some client holds; perturbing one client's head
    changes the generator update."""
    torch.manual_seed(0)
    spec = Linear()
    model = spec.build((8,), 3)
    method = FedGen()
    method.setup(model, 2)
    counts = [torch.tensor([3, 0, 0]), torch.tensor([1, 4, 0])]
    g = torch.Generator().manual_seed(1)

    def ctx(shift: float) -> ServerContext:
        results = [
            ClientResult(k, int(c.sum()), {"1.weight": torch.randn(3, 8, generator=g) + shift * k, "1.bias": torch.zeros(3)}, {"label_counts": c})
            for k, c in enumerate(counts)
        ]
        return ServerContext(2, seed=5, results=results, num_clients=2, build_model=lambda: spec.build((8,), 3))

    c0 = ctx(0.0)
    assert torch.allclose(method.ensemble_coefficients(c0.results), torch.tensor([[0.75, 0.0, 0.0], [0.25, 1.0, 0.0]]))
    assert method.generator_labels(c0.results).tolist() == [0, 1]
    g.manual_seed(1)
    ref = method.train_generator(ctx(0.0), {})[0]["generator"]
    g.manual_seed(1)
    out = method.train_generator(ctx(0.5), {})[0]["generator"]  # client 1's head moved
    assert not all(torch.allclose(out[k].float(), ref[k].float(), atol=1e-6) for k in ref)


def test_fedgen_uploads_label_counts_and_downloads_the_generator(tmp_path):
    """Counts = epochs × the client's label histogram; bytes_up adds them, bytes_down adds G from round 2."""
    executor = Recording()
    head_federation(tmp_path, rounds=2, method=FedGen(), executor=executor).fit()
    fed = head_federation(tmp_path / "unused")
    data = fed.data.build(fed.seed)
    for r in executor.results:
        assert torch.equal(r.upload["label_counts"], 2 * torch.bincount(data.clients[r.client_id].train.y, minlength=3))
    r1, r2 = metrics(tmp_path)
    state = load_checkpoint(tmp_path).server_state
    assert r2["bytes_down"] - r1["bytes_down"] == 4 * num_bytes(state["generator"])
    assert r1["bytes_up"] == r2["bytes_up"] == sum(num_bytes(r.weights) + 3 * 8 for r in executor.results[:4])
