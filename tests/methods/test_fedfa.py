"""FedFA: zero noise is the identity, the noise scale follows the shared variance, the server's statistics by hand
(paper and official forms), the clients' running statistics, p = 0 is FedAvg, the bytes of the statistics, layers
by name, resume, the quickstart overlay, serial == Ray and the compiled loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.method import HyperParameters
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedfa import FedFA, FedFAClient
from flsuite.methods.fedfa_layer import adaptive_weight, batch_variance, ffa, gaussian_std
from flsuite.models.heads import MLP, Linear
from tests.federation.test_run import CrashAtRound
from tests.helpers import cnn_federation, head_federation, run_cli

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---- FFA ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 4, 3, 5), (6, 4)], ids=["feature map", "feature vector"])
def test_zero_noise_is_the_identity(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1
    out, _ = ffa(x, torch.rand(4), torch.rand(4), torch.zeros(6, 4), torch.zeros(6, 4))
    torch.testing.assert_close(out, x, rtol=1e-5, atol=1e-5)


def test_the_noise_scale_follows_the_shared_variance():
    """With unit draws, β − μ is the Gaussian's std: sqrt((γ_μ + 1)(var_b μ + ε)), γ_μ = C r/Σ r, r = 1/(1 + 1/(v + ε));
    a channel the clients disagree on more gets more noise, and equal shared variances give γ = 1."""
    torch.manual_seed(1)
    x = torch.randn(5, 3, 2, 2)
    shared = torch.tensor([0.0, 1.0, 3.0])
    out, stats = ffa(x, shared, torch.ones(3), torch.ones(5, 3), torch.zeros(5, 3))
    mu = x.mean(dim=(2, 3))
    r = torch.tensor([1 / (1 + 1 / (v + EPS)) for v in (0.0, 1.0, 3.0)])
    gamma = 3 * r / r.sum()
    expected_std = ((gamma + 1) * (mu.var(0, unbiased=False) + EPS)).sqrt()
    shift = out.mean(dim=(2, 3)) - mu  # (x − μ)/σ has mean 0 over the positions, so the mean of x̂ is β
    torch.testing.assert_close(shift, expected_std.expand(5, 3), rtol=1e-4, atol=1e-5)
    sigma = (x.var(dim=(2, 3), unbiased=False) + EPS).sqrt()  # the scale's Gaussian, with the shared std variance
    out, _ = ffa(x, torch.ones(3), shared, torch.zeros(5, 3), torch.ones(5, 3))
    scaled = sigma + ((gamma + 1) * (sigma.var(0, unbiased=False) + EPS)).sqrt()
    torch.testing.assert_close(
        out, (x - mu[..., None, None]) / sigma[..., None, None] * scaled[..., None, None] + mu[..., None, None]
    )
    torch.testing.assert_close(adaptive_weight(torch.full((3,), 0.7), EPS), torch.ones(3))
    base = torch.tensor([0.2, 0.2, 0.2])
    assert torch.all(gaussian_std(base, shared, EPS).diff() > 0)
    torch.testing.assert_close(gaussian_std(base, torch.full((3,), 5.0), EPS), (2 * base).sqrt())


@pytest.mark.parametrize("form", ["paper", "official"])
def test_the_batch_variance_is_torchs_and_a_feature_vector_takes_the_general_form(form):
    """The two-pass batch variance equals `torch.var` (1/B, or unbiased in the official form; 1/B for one sample);
    on a feature vector x̂ and its gradient equal the general form written out with σ = √ε (x − μ = 0, so x̂ = β)."""
    torch.manual_seed(2)
    s = torch.randn(16, 7) * 2 + 3
    for batch in (s, s[:1]):
        unbiased = form == "official" and len(batch) > 1
        torch.testing.assert_close(batch_variance(batch, EPS, form), batch.var(0, unbiased=unbiased) + EPS)
    x, shared, draws = torch.randn(16, 7, requires_grad=True), torch.rand(7), torch.randn(2, 16, 7)
    out, stats = ffa(x, shared, torch.rand(7), draws[0], draws[1], EPS, form)
    mu, sigma = x, torch.full_like(x, EPS).sqrt()
    unbiased = form == "official"
    beta = mu + draws[0] * ((adaptive_weight(shared, EPS) + 1) * (mu.var(0, unbiased=unbiased) + EPS)).sqrt()
    gamma = sigma + draws[1] * ((adaptive_weight(torch.ones(7), EPS) + 1) * EPS).sqrt()
    expected = (x - mu) / sigma * gamma + beta
    torch.testing.assert_close(out, expected)
    (grad,) = torch.autograd.grad((out * draws[1]).sum(), x)
    (expected_grad,) = torch.autograd.grad((expected * draws[1]).sum(), x)
    torch.testing.assert_close(grad, expected_grad)
    torch.testing.assert_close(stats["mean"], x.mean(0))
    torch.testing.assert_close(stats["std"], torch.full((7,), EPS**0.5))


def test_the_server_statistics_aggregate_as_the_paper_says():
    """Three clients' running means of two channels: the new mean is their sample-weighted average, the shared
    variance the per-channel 1/K variance; the official form is one unbiased variance over all six values."""
    means = [[1.0, 0.0], [2.0, 0.0], [4.0, 3.0]]
    stds = [[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]
    results = [
        ClientResult(k, n, {}, upload={"features/mean": torch.tensor(m), "features/std": torch.tensor(s)})
        for k, (n, m, s) in enumerate(zip((1, 1, 2), means, stds))
    ]
    _, state = FedFA().aggregate(1, {}, results, {})
    torch.testing.assert_close(state["features/mean"], torch.tensor([(1 + 2 + 8) / 4, 6 / 4]))
    torch.testing.assert_close(state["features/std"], torch.tensor([1.0, (1 + 2 + 6) / 4]))
    torch.testing.assert_close(
        state["features/var_mean"], torch.tensor([14 / 9, 2.0])
    )  # (1, 2, 4): mean 7/3; (0, 0, 3): 2
    torch.testing.assert_close(state["features/var_std"], torch.tensor([0.0, 2 / 3]))
    _, official = FedFA(variance="official").aggregate(1, {}, results, {})
    torch.testing.assert_close(official["features/var_mean"], torch.tensor(means).flatten().var().expand(2))


def test_a_client_moves_its_running_statistics_by_momentum_and_uploads_them():
    model = Linear().build((3,), 2)
    broadcast = {
        "features/mean": torch.tensor([1.0, 2.0, 3.0]),
        "features/std": torch.ones(3),
        "features/var_mean": torch.ones(3),
        "features/var_std": torch.ones(3),
    }
    client = FedFAClient(
        model, FedFA(p=1.0, momentum=0.9).client_settings(), LocalTraining(), ClientTask(2, 0, 0, {}, broadcast)
    )
    client.begin()
    x = torch.randn(4, 3)
    _, statistics = client.local_loss(x, torch.tensor([0, 1, 0, 1]))
    client.gather({k: v.detach() for k, v in statistics.items()})
    up = client.upload(FitStatistics())
    torch.testing.assert_close(up["features/mean"], 0.9 * broadcast["features/mean"] + 0.1 * x.mean(0))
    torch.testing.assert_close(up["features/std"], 0.9 * torch.ones(3) + 0.1 * torch.full((3,), EPS**0.5))
    assert set(up) == {"features/mean", "features/std"}


# ---- runs --------------------------------------------------------------------------------------------------------
def test_p_zero_trains_as_fedavg_and_the_statistics_bytes_are_counted_exactly(tmp_path):
    """Linear head on 8-d features (C = 8): each client uploads 2 × 8 float32 more than FedAvg, and receives 4 × 8
    more from round 2 on (round 1: nothing, the initial values are the clients' own)."""
    head_federation(tmp_path / "avg", rounds=3, method=FedAvg()).fit()
    head_federation(tmp_path / "p0", rounds=3, method=FedFA(p=0.0)).fit()
    a, b = load_checkpoint(tmp_path / "avg").global_weights, load_checkpoint(tmp_path / "p0").global_weights
    assert all(torch.equal(a[k], b[k]) for k in a)
    for r, (avg, fa) in enumerate(zip(records(tmp_path / "avg"), records(tmp_path / "p0")), start=1):
        assert fa["bytes_up"] - avg["bytes_up"] == 4 * 2 * 8 * 4
        assert fa["bytes_down"] - avg["bytes_down"] == (0 if r == 1 else 4 * 4 * 8 * 4)
        assert fa["acc_mean"] == avg["acc_mean"] and fa["client/fedfa/features/applied"] == 0.0


def test_unknown_layers_are_named():
    client = FedFAClient(
        MLP(hidden=[4]).build((3,), 2), FedFA(layers=["9"]).client_settings(), LocalTraining(), ClientTask(1, 0, 0, {})
    )
    with pytest.raises(ValueError, match=r"FedFA layers \['9'\] are not submodules"):
        client.begin()


def test_a_killed_run_with_hooked_layers_resumes_to_the_uninterrupted_one(tmp_path):
    """SmallCNN on the quickstart's UCI digits, FFA after its first block ("3": 4 channels) and at its representation
    (16 units): killed when round 2 starts (the checkpoint holds round 1's statistics, which round 2's clients
    receive), resumed; the server's statistics are the uninterrupted run's."""
    kwargs = dict(rounds=2, method=FedFA(layers=["3", "features"]))
    cnn_federation(tmp_path / "full", **kwargs).fit()
    with pytest.raises(KeyboardInterrupt):
        cnn_federation(tmp_path / "killed", executor=CrashAtRound(2), **kwargs).fit()
    cnn_federation(None, **kwargs).fit(resume=tmp_path / "killed")
    assert (tmp_path / "killed" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()
    full, resumed = load_checkpoint(tmp_path / "full").server_state, load_checkpoint(tmp_path / "killed").server_state
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
    assert full["3/var_mean"].shape == (4,) and full["features/var_mean"].shape == (16,)
    assert 0 < records(tmp_path / "full")[0]["client/fedfa/3/applied"] < 1


def test_the_quickstart_overlay_runs(tmp_path, capsys):
    config = ["--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(ROOT / "configs/baselines/fedfa.yaml")]
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
    assert "client/fedfa/features/noise_std" in records(tmp_path / "run")[0]


def test_the_client_keeps_no_state_between_fits():
    """Two fits of one task in one process (another client's fit between them) are identical."""
    data = head_federation(None).data.build(seed=1)
    env = ClientEnvironment(
        data, MLP(hidden=[4]), HyperParameters(FedFA()), LocalTraining(epochs=1, batch_size=16, lr=0.1), seed=0
    )
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    first = run_client(env, ClientTask(1, 0, 11, weights))
    run_client(env, ClientTask(1, 1, 12, weights))
    again = run_client(env, ClientTask(1, 0, 11, weights))
    assert all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights)
    assert all(torch.equal(first.upload[k], again.upload[k]) for k in first.upload) and first.metrics == again.metrics


@pytest.mark.slow
def test_serial_and_ray_runs_are_identical(tmp_path, local_ray):
    """FedFA and FedMix (its exchange included) on two Ray workers: the serial run's metrics, byte for byte."""
    from flsuite.federation.ray_executor import RayExecutor
    from flsuite.methods.fedmix import FedMix

    for name, method in (("fedfa", FedFA()), ("fedmix", FedMix(lam=0.2, mix_group=10))):
        head_federation(tmp_path / name / "serial", rounds=2, model=MLP(hidden=[8]), method=method).fit()
        ray = RayExecutor(num_workers=2, keep_workers=True)
        head_federation(tmp_path / name / "ray", rounds=2, model=MLP(hidden=[8]), method=method, executor=ray).fit()
        assert (tmp_path / name / "ray" / "metrics.jsonl").read_bytes() == (
            tmp_path / name / "serial" / "metrics.jsonl"
        ).read_bytes()


@pytest.mark.slow
def test_the_compiled_loop_runs_it_and_matches_lean_at_p_zero():
    from tests.federation.local.test_compiled import client_fits

    lean, fast = client_fits("lean", method=FedFA(p=0.0)), client_fits("compiled", method=FedFA(p=0.0))
    for a, b in zip(lean, fast):
        for k in a.weights:
            torch.testing.assert_close(b.weights[k], a.weights[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.upload["features/mean"], a.upload["features/mean"], rtol=1e-5, atol=1e-6)
    assert all(r.num_steps == 33 for r in client_fits("compiled", method=FedFA(p=1.0)))


def test_auto_keeps_it_on_the_lean_loop_where_fedavg_compiles(monkeypatch):
    """`local.loop: auto` reads `FedFAClient.compiled_pays`: where the run's steps would compile FedAvg's client,
    FedFA's stays lean (its compiled draws are slower than its lean steps)."""
    from flsuite.federation.local import choice
    from flsuite.federation.run_loop_choice import run_loop_choice
    from flsuite.federation.state import FederationState

    monkeypatch.setattr(choice, "COMPILE_PAYS_FROM_STEPS", 1)
    loops = {}
    for name, method in (("fedavg", FedAvg()), ("fedfa", FedFA())):
        federation = head_federation(None, method=method)
        loops[name] = run_loop_choice(federation, federation.raw_data(), FederationState.empty())
    assert loops["fedavg"].loop == "compiled"
    assert loops["fedfa"].loop == "lean" and "compiled_pays" in loops["fedfa"].reason
