"""FedCiR's loss terms and what they log (`flsuite.methods.fedcir_terms`): the generator ensembles against the
aggregated head, the terms' values, loss shares and gradient shares against hand computations, L_align's two batch
reductions, the round records (no term silently zero), the compiled loop, and clear errors for bad options."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.local.steps import gather, probe
from flsuite.federation.method import HyperParameters
from flsuite.federation.server import RoundServer
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.methods.fedcir import FedCiR, FedCiRClient
from flsuite.methods.fedcir_terms import reduce_kl
from flsuite.methods.generator_model import build_generator, ensemble_loss
from flsuite.models.probabilistic import ProbabilisticEncoder
from tests.helpers import head_federation

ENCODER = dict(hidden=[16], dim=8)
LAM_REG, LAM_ALIGN = 0.7, 0.3


def _results(heads: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int], method: FedCiR) -> list[ClientResult]:
    spec = ProbabilisticEncoder(**ENCODER)
    torch.manual_seed(0)
    model = spec.build((6,), 3)
    method.setup(model, len(heads))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    return [
        ClientResult(k, n, {**base, "fc.weight": w, "fc.bias": b}) for k, ((w, b), n) in enumerate(zip(heads, counts))
    ]


def _heads(k: int, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(3, 8, generator=g, dtype=dtype), torch.randn(3, generator=g, dtype=dtype)) for _ in range(k)]


def test_averaged_logits_are_the_aggregated_head_and_per_client_is_not():
    """With FedAvg's α_k (8, 24, 32 of 64 samples: exact in float32), CE(Σ_k α_k h_k(z), y) is the CE of FedAvg's
    aggregated head (float64: to 1e-12); "per_client" is Σ_k α_k CE(h_k(z), y) by hand and differs from it."""
    heads, counts = _heads(3, torch.float64), [8, 24, 32]
    method = FedCiR()
    results = _results(heads, counts, method)
    aggregated, _ = method.aggregate(2, results[0].weights, results, {})
    w, b = aggregated["fc.weight"], aggregated["fc.bias"]
    coef = method.ensemble_coefficients(results).double()
    g = torch.Generator().manual_seed(2)
    z, y = torch.randn(32, 8, generator=g, dtype=torch.float64), torch.randint(3, (32,), generator=g)
    global_ce = F.cross_entropy(F.linear(z, w, b), y)
    assert ensemble_loss(z, y, heads, coef, "logits").item() == pytest.approx(global_ce.item(), abs=1e-12)
    by_hand = sum(n / sum(counts) * F.cross_entropy(F.linear(z, wk, bk), y) for (wk, bk), n in zip(heads, counts))
    per_client = ensemble_loss(z, y, heads, coef, "per_client")
    assert per_client.item() == pytest.approx(float(by_hand), abs=1e-12)
    assert abs(per_client.item() - global_ce.item()) > 0.1


def test_per_client_trains_the_generator_on_another_target_than_the_aggregated_head():
    """The generator's E_g steps from the same stream: with "logits" the round's heads give the losses their aggregated
    head alone gives (to rounding); with "per_client" the losses differ (the target is not the global head)."""
    heads, counts = _heads(3), [8, 24, 32]
    alpha = [n / sum(counts) for n in counts]
    avg = (sum(a * w for a, (w, _) in zip(alpha, heads)), sum(a * b for a, (_, b) in zip(alpha, heads)))

    def generator_loss(ensemble: str, hs: list) -> float:
        method = FedCiR(ensemble=ensemble)
        results = _results(hs, counts, method)
        ctx = RoundServer(
            2,
            seed=11,
            results=results,
            num_clients=3,
            build_model=lambda: ProbabilisticEncoder(**ENCODER).build((6,), 3),
        )
        return method.train_generator(ctx, {})[1]

    assert generator_loss("logits", heads) == pytest.approx(generator_loss("logits", [avg] * 3), rel=1e-6)
    assert abs(generator_loss("per_client", heads) - generator_loss("per_client", [avg] * 3)) > 0.1


def _client(kl_reduction: str = "batch_mean", lam_reg: float = LAM_REG, lam_align: float = LAM_ALIGN):
    torch.manual_seed(0)
    model = ProbabilisticEncoder(**ENCODER).build((6,), 3).train()
    gen = build_generator(3, 8, 4, 16, seed=1).eval()
    mu_g, sigma_g = torch.randn(3, 8), torch.rand(3, 8) + 0.5
    method = FedCiR(lam_reg=lam_reg, lam_align=lam_align, noise_dim=4, hidden=16, kl_reduction=kl_reduction)
    task = ClientTask(2, 0, 0, {}, {"generator": gen.state_dict(), "mu_g": mu_g, "sigma_g": sigma_g})
    client = FedCiRClient(model, method.client_settings(), LocalTraining(), task)
    client.begin()
    return client, model, gen, mu_g, sigma_g


def _hand_terms(model, gen, mu_g, sigma_g, x, y, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(CE, L_reg, per-sample KL [B]) with the client's draws (z's ε, then ỹ, then ε̃), written out."""
    torch.manual_seed(seed)
    mu, sigma = model.encode(x)
    z = mu + sigma * torch.randn_like(mu)
    y_gen = torch.randint(3, (len(y),))
    z_gen = gen(y_gen, torch.randn(len(y), 4)).detach()
    sg, mg = sigma_g[y], mu_g[y]
    kl = (torch.log(sg / sigma) + (sigma**2 + (mu - mg) ** 2) / (2 * sg**2) - 0.5).sum(1)
    return F.cross_entropy(model.fc(z), y), F.cross_entropy(model.fc(z_gen), y_gen), kl


def _norm(value: torch.Tensor, params: list) -> float:
    grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads if g is not None))


def test_logged_terms_and_shares_equal_a_hand_computation():
    """Two steps gathered, then the probe: each term's mean over the steps, each weighted term's mean share
    λ_t L_t / L, and ‖∇ λ_t L_t‖ / ‖∇ L_CE‖ on the probe's batch, all by hand; `.grad` and the RNG left alone."""
    client, model, gen, mu_g, sigma_g = _client()
    g = torch.Generator().manual_seed(4)
    batches = [
        (torch.randn(5, 6, generator=g), torch.tensor([0, 1, 2, 0, 1])),
        (torch.randn(5, 6, generator=g), torch.tensor([2, 2, 1, 0, 0])),
    ]
    hand, fit = [], FitStatistics()
    for seed, (x, y) in zip((3, 4), batches):
        torch.manual_seed(seed)
        loss, statistics = client.local_loss(x, y)
        gather(client, fit, statistics)
        fit.num_steps += 1
        ce, reg, kl = _hand_terms(model, gen, mu_g, sigma_g, x, y, seed)
        total = ce + LAM_ALIGN * kl.mean() + LAM_REG * reg
        assert loss.item() == pytest.approx(total.item(), rel=1e-6)
        hand.append((ce.item(), reg.item(), kl.mean().item(), total.item()))
    torch.manual_seed(9)
    before = torch.get_rng_state()
    probe(client, *batches[0])
    assert torch.equal(torch.get_rng_state(), before) and all(p.grad is None for p in model.parameters())
    ce, reg, kl = _hand_terms(model, gen, mu_g, sigma_g, *batches[0], seed=9)
    params = list(model.parameters())
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    expected = {
        "ce": mean([h[0] for h in hand]),
        "reg": mean([h[1] for h in hand]),
        "align": mean([h[2] for h in hand]),
        "reg_loss_share": mean([LAM_REG * h[1] / h[3] for h in hand]),
        "align_loss_share": mean([LAM_ALIGN * h[2] / h[3] for h in hand]),
        "reg_grad_vs_ce": _norm(LAM_REG * reg, params) / _norm(ce, params),
        "align_grad_vs_ce": _norm(LAM_ALIGN * kl.mean(), params) / _norm(ce, params),
    }
    got = client.metrics(fit)
    assert list(got) == list(expected)
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-5), k
        assert got[k] > 0, k
    assert fit.mean_task_loss == got["ce"]  # the FL-task loss is the CE, without the regularisers


def test_batch_sum_is_batch_size_times_batch_mean():
    """`kl_reduction: batch_sum`: L_align = Σ_i KL_i = B × batch_mean's (1/B) Σ_i KL_i, by hand, and the loss uses
    it."""
    x, y = torch.randn(5, 6, generator=torch.Generator().manual_seed(4)), torch.tensor([0, 1, 2, 0, 1])
    out = {}
    for reduction in ("batch_mean", "batch_sum"):
        client, model, gen, mu_g, sigma_g = _client(kl_reduction=reduction)
        torch.manual_seed(3)
        loss, statistics = client.local_loss(x, y)
        ce, reg, kl = _hand_terms(model, gen, mu_g, sigma_g, x, y, seed=3)
        align = kl.sum() if reduction == "batch_sum" else kl.mean()
        assert statistics["align"].item() == pytest.approx(align.item(), rel=1e-6)
        assert loss.item() == pytest.approx((ce + LAM_ALIGN * align + LAM_REG * reg).item(), rel=1e-6)
        out[reduction] = statistics["align"].item()
    assert out["batch_sum"] == pytest.approx(5 * out["batch_mean"], rel=1e-6)
    kl = torch.tensor([1.0, 2.0, 4.0])
    assert reduce_kl(kl, "batch_sum").item() == 7.0 and reduce_kl(kl, "batch_mean").item() == pytest.approx(7 / 3)


def test_round_records_log_every_term_and_none_is_silently_zero(tmp_path):
    """Round 1 (no term on yet): only `ce`. Round 2: every term, its loss share and gradient share, each > 0, and
    the logged terms add up to the logged loss: train_loss = ce + λ_align · align + λ_reg · reg."""
    lam_reg, lam_align = 0.5, 1e-3
    head_federation(
        tmp_path, rounds=2, model=ProbabilisticEncoder(**ENCODER), method=FedCiR(lam_reg=lam_reg, lam_align=lam_align)
    ).fit()
    r1, r2 = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert [k for k in r1 if k.startswith("client/")] == ["client/fedcir/ce"] and r1[
        "client/fedcir/ce"
    ] == pytest.approx(r1["train_loss"], rel=1e-12)
    logged = {k.removeprefix("client/fedcir/"): v for k, v in r2.items() if k.startswith("client/")}
    assert list(logged) == [
        "ce",
        "reg",
        "align",
        "reg_loss_share",
        "align_loss_share",
        "reg_grad_vs_ce",
        "align_grad_vs_ce",
    ]
    assert all(math.isfinite(v) and v > 0 for v in logged.values()), logged
    assert r2["train_loss"] == pytest.approx(
        logged["ce"] + lam_align * logged["align"] + lam_reg * logged["reg"], rel=1e-6
    )
    assert 0 < logged["reg_loss_share"] + logged["align_loss_share"] < 1


def test_a_term_that_is_off_is_not_logged_and_zero_lambdas_log_nothing(tmp_path):
    head_federation(
        tmp_path / "reg", rounds=2, model=ProbabilisticEncoder(**ENCODER), method=FedCiR(lam_reg=0.5, lam_align=0.0)
    ).fit()
    r2 = json.loads((tmp_path / "reg" / "metrics.jsonl").read_text().splitlines()[1])
    assert [k for k in r2 if k.startswith("client/")] == [
        "client/fedcir/ce",
        "client/fedcir/reg",
        "client/fedcir/reg_loss_share",
        "client/fedcir/reg_grad_vs_ce",
    ]
    head_federation(
        tmp_path / "off", rounds=2, model=ProbabilisticEncoder(**ENCODER), method=FedCiR(lam_reg=0.0, lam_align=0.0)
    ).fit()
    assert "client/" not in (tmp_path / "off" / "metrics.jsonl").read_text()


@pytest.mark.slow  # one compilation (~1 min on 2 shared cores)
def test_the_compiled_loop_logs_what_the_lean_loop_does():
    """Statistics through the scanned steps and the probe before them: the lean fit's metrics up to rounding (a
    deterministic encoder and L_align only, so that no random draw differs between eager and compiled code)."""
    data = GaussianFeatures(dim=6, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=44).build(
        seed=1
    )
    broadcast = {
        "mu_g": torch.randn(3, 8, generator=torch.Generator().manual_seed(0)),
        "sigma_g": torch.full((3, 8), 0.7),
    }
    fits = {}
    for loop in ("lean", "compiled"):
        local = LocalTraining(epochs=3, batch_size=4, lr=0.1, loop=loop)
        env = ClientEnvironment(
            data,
            ProbabilisticEncoder(**ENCODER, stochastic=False),
            HyperParameters(FedCiR(lam_reg=0.0, lam_align=0.05)),
            local,
            seed=0,
        )
        torch.manual_seed(0)
        fits[loop] = run_client(env, ClientTask(2, 0, 10, env.build_model().state_dict(), broadcast)).metrics
    assert list(fits["lean"]) == list(fits["compiled"]) == ["ce", "align", "align_loss_share", "align_grad_vs_ce"]
    assert (
        fits["compiled"]["align_grad_vs_ce"] == fits["lean"]["align_grad_vs_ce"]
    )  # the same eager probe, same weights
    for k in fits["lean"]:
        assert fits["compiled"][k] == pytest.approx(fits["lean"][k], rel=1e-4), k


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ensemble": "per_label"}, "FedCiR ensemble must be 'logits', 'mixture' or 'per_client', got 'per_label'"),
        ({"kl_reduction": "mean"}, "FedCiR kl_reduction must be one of 'batch_mean', 'batch_sum', got 'mean'"),
    ],
)
def test_bad_options_name_the_option_and_its_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedCiR(**kwargs)


def test_bad_modes_of_the_shared_helpers_name_their_values():
    with pytest.raises(ValueError, match="kl_reduction must be one of 'batch_mean', 'batch_sum', got 'sum'"):
        reduce_kl(torch.ones(2), "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown generator ensemble 'per_label' \(logits, mixture or per_client\)"):
        labels = torch.zeros(2, dtype=torch.long)
        ensemble_loss(torch.zeros(2, 8), labels, _heads(1), torch.ones(1, 3), "per_label")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("ensemble_loss", "generator_model"),
        ("ConditionalGenerator", "generator_model"),
        ("GeneratorFit", "generator_fit"),
    ],
)
def test_the_generators_old_names_still_import_with_a_deprecation_warning(name, home):
    import importlib

    from flsuite.methods import generators

    with pytest.warns(DeprecationWarning, match=rf"generators\.{name} is now flsuite\.methods\.{home}\.{name}"):
        found = getattr(generators, name)
    assert found is getattr(importlib.import_module(f"flsuite.methods.{home}"), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        generators.nothing_here  # noqa: B018
