"""FedNova and FedDC (FedEGG's baselines): reductions (FedNova with equal steps = FedAvg; FedDC's first round =
FedProx with μ = α) and hand computations of their server updates and client states."""

from __future__ import annotations

import json

import pytest
import torch

from flsuite.data.base import ClientData, DataSource, FederatedData
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.task import ClientResult, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.feddc import FedDC
from flsuite.methods.fednova import FedNova
from flsuite.methods.fedprox import FedProx
from flsuite.methods.scaffold import effective_steps
from tests.helpers import head_federation, initial_weights
from tests.methods.test_baselines import Recording

SGD = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)


class Uneven(DataSource):
    """GaussianFeatures whose client k keeps 20 + 25k samples: unequal local step counts."""

    def build(self, seed: int) -> FederatedData:
        data = GaussianFeatures(
            dim=8, num_classes=3, num_domains=2, clients_per_domain=2, samples_per_client=100, test_per_domain=60
        ).build(seed)
        clients = [ClientData(k, c.domain, c.train.subset(range(20 + 25 * k))) for k, c in enumerate(data.clients)]
        return FederatedData(clients, data.test, data.num_classes)


# ---- FedNova -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_with_equal_steps_is_fedavg(tmp_path, momentum):
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=momentum, weight_decay=0.0)
    head_federation(tmp_path / "nova", local=local, method=FedNova()).fit()
    head_federation(tmp_path / "avg", local=local, method=FedAvg()).fit()
    a, b = load_checkpoint(tmp_path / "nova").global_weights, load_checkpoint(tmp_path / "avg").global_weights
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_fednova_server_step_by_hand():
    """x = 0; y_1 = 1 (a = 2, n = 1), y_2 = 6 (a = 6, n = 3): p = (1/4, 3/4), d = (−1/2, −1), τ_eff = 5,
    x ← 0 − 5·(−1/8 − 3/4) = 4.375 (FedAvg: 4.75)."""
    model = torch.nn.Linear(1, 1, bias=False)
    x = {"weight": torch.zeros(1, 1)}
    results = [
        ClientResult(0, 1, {"weight": torch.full((1, 1), 1.0)}, upload={"a": torch.tensor(2.0, dtype=torch.float64)}),
        ClientResult(1, 3, {"weight": torch.full((1, 1), 6.0)}, upload={"a": torch.tensor(6.0, dtype=torch.float64)}),
    ]
    method = FedNova()
    method.setup(model, num_clients=2)
    new, _ = method.aggregate(1, x, results, {})
    assert float(new["weight"]) == 4.375
    assert float(FedAvg().aggregate(1, x, results, {})[0]["weight"]) == 4.75


def test_fednova_uneven_clients_upload_their_effective_steps_and_the_server_normalises(tmp_path):
    local = LocalTraining(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=0.0)
    rec = Recording()
    fed = head_federation(tmp_path, data=Uneven(), rounds=1, local=local, method=FedNova(), executor=rec)
    x = initial_weights(fed)
    fed.fit()
    steps = [r.num_steps for r in rec.results]
    assert steps == [4, 6, 10, 12]  # 20, 45, 70, 95 samples, batch 16, 2 epochs
    assert [float(r.upload["a"]) for r in rec.results] == [effective_steps(s, 0.9) for s in steps]
    n = sum(r.num_samples for r in rec.results)
    p = [r.num_samples / n for r in rec.results]
    a = [effective_steps(s, 0.9) for s in steps]
    tau_eff = sum(pk * ak for pk, ak in zip(p, a))
    got = load_checkpoint(tmp_path).global_weights
    for name in ("1.weight", "1.bias"):
        x64 = x[name].double()
        expected = x64 - tau_eff * sum(
            pk * (x64 - r.weights[name].double()) / ak for pk, ak, r in zip(p, a, rec.results)
        )
        torch.testing.assert_close(got[name], expected.float(), rtol=0, atol=1e-6)
        fedavg = sum(pk * r.weights[name] for pk, r in zip(p, rec.results))
        assert not torch.allclose(got[name], fedavg, atol=1e-4)  # unequal steps: not FedAvg


# ---- FedDC -------------------------------------------------------------------------------------------------------
def test_feddc_round_one_clients_are_fedprox_with_mu_alpha(tmp_path):
    dc, prox = Recording(), Recording()
    head_federation(tmp_path / "dc", rounds=1, local=SGD, method=FedDC(alpha=0.5), executor=dc).fit()
    head_federation(tmp_path / "prox", rounds=1, local=SGD, method=FedProx(mu=0.5), executor=prox).fit()
    for a, b in zip(dc.results, prox.results):
        assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)


@pytest.mark.parametrize("drift_lr", ["base", "current"])
def test_feddc_states_and_server_update_by_hand_over_two_rounds(tmp_path, drift_lr):
    """Two rounds with the rate dropped ×0.1 in round 2: c_k⁺ divides Δ_k by the base rate (official) or by the
    round's rate (`drift_lr: current`)."""
    rec = Recording()
    alpha = 0.1
    local = LocalTraining(
        epochs=2, batch_size=16, lr=0.05, lr_milestones=[2], lr_gamma=0.1, momentum=0.0, weight_decay=0.0
    )
    fed = head_federation(
        tmp_path, rounds=2, local=local, method=FedDC(alpha=alpha, drift_lr=drift_lr), executor=rec, checkpoint_every=1
    )
    w = {k: v.double() for k, v in initial_weights(fed).items()}
    fed.fit()
    names, N = ("1.weight", "1.bias"), 4
    c = {n: torch.zeros_like(w[n]) for n in names}
    hbar = {n: torch.zeros_like(w[n]) for n in names}
    h_k = {k: {n: torch.zeros_like(w[n]) for n in names} for k in range(N)}
    c_k = {k: {n: torch.zeros_like(w[n]) for n in names} for k in range(N)}
    for rnd in (1, 2):
        results = rec.results[4 * (rnd - 1) : 4 * rnd]
        for r in results:
            k, K = r.client_id, r.num_steps
            for n in names:
                delta = r.weights[n].double() - w[n]
                eta = local.lr if drift_lr == "base" else local.lr_at(rnd)
                c_plus = c_k[k][n] - c[n] - delta / (K * eta)
                torch.testing.assert_close(r.upload["delta_c"][n].double(), c_plus - c_k[k][n], rtol=0, atol=1e-5)
                h_k[k][n], c_k[k][n] = h_k[k][n] + delta, c_plus
                torch.testing.assert_close(r.state["h"][n].double(), h_k[k][n], rtol=0, atol=1e-6)
        for n in names:
            total = sum(r.weights[n].double() for r in results)
            c[n] = c[n] + sum(r.upload["delta_c"][n].double() for r in results) / N
            hbar[n] = hbar[n] + (total - len(results) * w[n]) / N
            w[n] = total / len(results) + hbar[n]
    state = load_checkpoint(tmp_path)
    for n in names:
        torch.testing.assert_close(state.global_weights[n].double(), w[n], rtol=0, atol=1e-5)
        torch.testing.assert_close(state.server_state["c"][n].double(), c[n], rtol=0, atol=1e-5)
        torch.testing.assert_close(state.server_state["h"][n].double(), hbar[n], rtol=0, atol=1e-6)
        # h̄ is the mean of every client's drift (all four clients take part in this federation)
        torch.testing.assert_close(hbar[n], sum(h_k[k][n] for k in range(N)) / N, rtol=0, atol=1e-12)
    assert c[names[0]].abs().sum() > 0 and hbar[names[0]].abs().sum() > 0


@pytest.mark.parametrize("clip_norm", [1e-2, None])
def test_feddc_clips_each_step_gradient_to_clip_norm(tmp_path, clip_norm):
    """One round-1 step from w (h_k = 0: the drift penalty's gradient is 0 there): θ_k − w = −η · g, with ‖g‖ clipped to
    `clip_norm` (official max_norm) or, unclipped, the cross-entropy gradient's norm (far above 1e-2; float32 weights:
    rtol 1e-3)."""
    rec = Recording()
    one_step = LocalTraining(steps=1, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)
    fed = head_federation(
        tmp_path, rounds=1, local=one_step, method=FedDC(alpha=0.1, clip_norm=clip_norm), executor=rec
    )
    w = initial_weights(fed)
    fed.fit()
    for r in rec.results:
        step = torch.cat([(r.weights[n].double() - w[n].double()).flatten() for n in ("1.weight", "1.bias")]).norm()
        if clip_norm is None:
            assert step > 0.05 * 0.1
        else:
            torch.testing.assert_close(step, torch.tensor(0.05 * clip_norm, dtype=torch.float64), rtol=1e-3, atol=0)


def test_feddc_refuses_bad_options():
    with pytest.raises(ValueError, match="drift_lr must be 'base' or 'current', got 'round'"):
        FedDC(drift_lr="round")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clip_norm must be > 0 or null, got 0"):
        FedDC(clip_norm=0)


def test_feddc_uploads_weights_and_delta_c(tmp_path):
    head_federation(tmp_path, rounds=1, method=FedDC()).fit()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    theta = (8 * 3 + 3) * 4
    assert record["bytes_up"] == 4 * 2 * theta
