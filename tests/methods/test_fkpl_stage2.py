"""FKPL Stage II against hand computations: the domain prototypes, λ's bounds and side, the partner set (one vs all),
the expert initialisation, and the run's bytes against Table 9 on the suite's Office and PACS client layouts. Each
test was seen to fail with the code it checks broken (docs/fkpl.md, "Tests")."""

from __future__ import annotations

import pytest
import torch

from flsuite.compare.runs import load_run
from flsuite.compare.stats import run_traffic
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.phases import Rounds
from flsuite.federation.query import QueryTask
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl.model import ConcatExperts, SeededInit, encode, encoder_weights, head_keys
from flsuite.methods.fkpl.prototypes import VirtualFeatureQuery
from flsuite.models.heads import MLP
from flsuite.seeding import derive_seed
from tests.helpers import head_federation
from tests.methods.test_fkpl import PlantedSubspaces, _concat, _local, fkpl_federation, records

SEED = 7  # head_federation's


def _broadcast(protos: torch.Tensor, has: torch.Tensor, cluster: list[int]) -> dict[str, torch.Tensor]:
    return {"protos": protos[has], "has": has, "cluster": torch.tensor(cluster)}


# ---- domain prototypes ----------------------------------------------------------------------------------------------
def test_domain_prototypes_are_the_unweighted_mean_of_the_members_class_means(tmp_path):
    """P_v^k = mean over cluster v's holders of k of p_m^k = mean F(x) over m's class-k samples (§1.5–1.6), from F's
    weights and the clients' data by hand: a constant factor in either step, or sample weighting, fails."""
    fkpl_federation(tmp_path, head_epochs=1).fit()
    state = load_checkpoint(tmp_path)
    got = state.answers["calibrate"]["prototypes"].value["protos"]
    enc = encoder_weights(
        [state.outputs[f"experts/expert{v}"]["weights"] for v in range(3)], head_keys(MLP(hidden=(8,)).build((16,), 3))
    )
    model = ConcatExperts(MLP(hidden=(8,)), 3, enc, with_head=False).build((16,), 3)
    clients = PlantedSubspaces().build(SEED).clients
    sizes = set()
    for v, group in enumerate([[0, 1], [2, 3], [4, 5]]):
        for k in range(3):
            means = [
                encode(model, clients[m].train.x)[clients[m].train.y == k].mean(0)
                for m in group
                if (clients[m].train.y == k).any()
            ]
            sizes |= {int((clients[m].train.y == k).sum()) for m in group}
            torch.testing.assert_close(got[v, k], torch.stack(means).mean(0))
    assert len(sizes) > 1  # unequal class counts: a sample-weighted mean would differ
    assert got.abs().max() > 0.1  # not trivially zero


# ---- λ ------------------------------------------------------------------------------------------------------------
def _recovered_lambda(
    lam_on: str, a: float, b: float, decimals: int | None = None, passes: int = 20
) -> tuple[torch.Tensor, torch.Tensor]:
    """λ of every virtual feature of client 2 (partner all, 2 clusters × 3 classes all held), solved from
    z̃ − F = t·(P − F) (t = 1 − λ for lam_on feature, λ for prototype), and the residual of that fit."""
    data, model, _ = _concat()
    client = data.clients[2]
    protos = 3 * torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
    bc = _broadcast(protos, torch.ones(2, 3, dtype=torch.bool), [0, 0, 1, 1, 0, 1])
    up = VirtualFeatureQuery(a, b, lam_on, "all", passes, decimals).compute(client, QueryTask(2, 5, None, bc), model)
    real, y = encode(model, client.train.x), client.train.y
    i = torch.arange(len(y)).repeat_interleave(2).repeat(passes)  # sample-major, clusters ascending, per pass
    v = torch.arange(2).repeat(len(y)).repeat(passes)
    f, p = real[i].double(), protos[v, y[i]].double()
    t = ((up["features"].double() - f) * (p - f)).sum(1) / ((p - f) ** 2).sum(1)
    residual = (up["features"].double() - (f + t[:, None] * (p - f))).abs().max()
    return (1 - t if lam_on == "feature" else t), residual


@pytest.mark.parametrize("lam_on", ["feature", "prototype"])
@pytest.mark.parametrize("a, b", [(0.2, 0.5), (0.3, 0.7), (0.6, 0.6)])
def test_lambda_fills_exactly_u_a_b_on_the_side_lam_on_names(lam_on, a, b):
    """z̃ = λ·F + (1 − λ)·P (feature) or (1 − λ)·F + λ·P (prototype) with λ ~ U(a, b): the recovered λ stay in [a, b]
    and reach both ends (1,200 draws), so a λ that ignores a (e.g. b·U) or b (e.g. a + (1 − a)·U) fails."""
    lam, residual = _recovered_lambda(lam_on, a, b)
    assert residual < 1e-5  # each z̃ lies on the segment from F(x) to its partner
    assert lam.min() >= a - 1e-5 and lam.max() <= b + 1e-5
    assert lam.min() < a + 0.01 and lam.max() > b - 0.01


def test_lam_decimals_rounds_every_draw_as_the_official_code():
    """The official λ = np.round(l + r_reg·U, 2): with lam_decimals 2 every λ is a multiple of 0.01 in [a, b]."""
    lam, _ = _recovered_lambda("prototype", 0.2, 0.5, decimals=2)
    hundredths = lam * 100
    assert (hundredths - hundredths.round()).abs().max() < 1e-3
    assert (
        lam.min() >= 0.2 - 1e-5 and lam.max() <= 0.5 + 1e-5 and len(torch.unique(hundredths.round())) == 31
    )  # 0.20 … 0.50
    unrounded, _ = _recovered_lambda("prototype", 0.2, 0.5)
    assert ((unrounded * 100) - (unrounded * 100).round()).abs().max() > 0.1


# ---- the partner set ------------------------------------------------------------------------------------------------
#: 3 clusters × 3 classes; class 0 is held by every cluster, class 1 by clusters 0 and 2, class 2 by clusters 1 and 2.
HAS = torch.tensor([[True, True, False], [True, False, True], [True, True, True]])


def _partner_setup():
    data, model, _ = _concat()
    client = data.clients[2]  # in cluster 1
    protos = torch.randn(3, 3, 8, generator=torch.Generator().manual_seed(2)) * HAS[..., None]
    return client, model, protos, _broadcast(protos, HAS, [0, 0, 1, 1, 2, 2])


def test_partner_all_pairs_each_sample_with_every_cluster_prototype_of_its_class():
    """`all` (the official set): one z̃ per (sample i, cluster v ∈ V_{y_i}), N_g = Σ_i |V_{y_i}|, own cluster included;
    with λ = 0.5 each is 0.5·F(x_i) + 0.5·P_v^{y_i}, in sample-major, cluster-ascending order."""
    client, model, protos, bc = _partner_setup()
    real, y = encode(model, client.train.x), client.train.y
    assert set(y.tolist()) == {0, 1, 2}
    up = VirtualFeatureQuery(0.5, 0.5, "feature", "all", 1).compute(client, QueryTask(2, 5, None, bc), model)
    pairs = [(i, v) for i in range(len(y)) for v in range(3) if HAS[v, y[i]]]
    assert len(up["features"]) == len(pairs) == sum(int(HAS[:, k].sum()) for k in y.tolist()) > 2 * len(y)
    torch.testing.assert_close(up["features"], torch.stack([0.5 * real[i] + 0.5 * protos[v, y[i]] for i, v in pairs]))
    assert torch.equal(up["labels"], torch.tensor([int(y[i]) for i, _ in pairs]))
    twice = VirtualFeatureQuery(0.5, 0.5, "feature", "all", 2).compute(client, QueryTask(2, 5, None, bc), model)
    assert len(twice["features"]) == 2 * len(pairs)


def test_partner_one_draws_one_cluster_holding_the_class_per_sample_and_other_avoids_its_own():
    """`one`: n z̃ per pass, each (λ = 0: the prototype itself) the prototype of a cluster holding y, every such cluster
    drawn over 40 passes; `other`: client 2 (cluster 1) never draws cluster 1 when another cluster holds y."""
    client, model, protos, bc = _partner_setup()
    y = client.train.y
    for partner, allowed in (("one", HAS), ("other", HAS & torch.tensor([[True], [False], [True]]))):
        up = VirtualFeatureQuery(0.0, 0.0, "feature", partner, 40).compute(client, QueryTask(2, 5, None, bc), model)
        assert len(up["features"]) == 40 * len(y) and torch.equal(up["labels"], y.repeat(40))
        drawn = set()
        for row, k in zip(up["features"], up["labels"].tolist()):
            match = [v for v in range(3) if torch.equal(row, protos[v, k])]
            assert len(match) == 1 and allowed[match[0], k]
            drawn.add((k, match[0]))
        assert drawn == {(k, v) for k in range(3) for v in range(3) if allowed[v, k]}


# ---- expert initialisation ------------------------------------------------------------------------------------------
def test_independent_expert_init_starts_each_expert_from_its_own_derived_stream(tmp_path):
    """`expert_init: independent`: expert v is a FedAvg run over its members from SeededInit(seed derived from
    (seed, cluster v)), bit for bit; the experts' draws differ from each other and from the shared `model_init`."""
    fkpl_federation(tmp_path, head_epochs=1, expert_init="independent").fit()
    got = load_checkpoint(tmp_path).outputs
    spec = lambda v: SeededInit(MLP(hidden=(8,)), derive_seed(SEED, purpose=f"fkpl/expert{v}/model_init"))  # noqa: E731
    for v, group in ((0, [0, 1]), (2, [4, 5])):
        alone = [Rounds(name="x", clients=group, method=FedAvg())]
        head_federation(
            tmp_path / f"sub{v}", data=PlantedSubspaces(), model=spec(v), rounds=2, local=_local(), protocol=alone
        ).fit()
        want = load_checkpoint(tmp_path / f"sub{v}").global_weights
        assert all(torch.equal(got[f"experts/expert{v}"]["weights"][k], want[k]) for k in want)
    torch.manual_seed(derive_seed(SEED, purpose="model_init"))
    inits = [spec(v).build((16,), 3).state_dict()["1.weight"] for v in range(3)] + [
        MLP(hidden=(8,)).build((16,), 3).state_dict()["1.weight"]
    ]
    assert all(not torch.equal(inits[i], inits[j]) for i in range(4) for j in range(i))
    with pytest.raises(ValueError, match="expert_init must be 'shared' or 'independent', got 'own'"):
        FKPL(expert_init="own")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"partner must be 'one', 'other' or 'all', got 'any' \('any' is now 'one'\)"):
        FKPL(partner="any")  # type: ignore[arg-type]


# ---- bytes: Table 9 -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "layout, partner", [([2, 3, 3, 2], "one"), ([5, 4, 5, 6], "all")], ids=["office-2332", "pacs-5456"]
)
def test_the_runs_bytes_are_table_9s_sum_with_f_counted_once(tmp_path, layout, partner):
    """The suite's Office-Caltech-10 (caltech 2 / amazon 3 / webcam 3 / dslr 2) and PACS (photo 5 / art 4 / cartoon 5 /
    sketch 6) client counts over 4 planted domains: "bytes up / run" and "bytes down / run" (`flsuite compare`'s
    `run_traffic`) equal Table 9's counts × 4 bytes (float32), plus what Table 9 does not count: the int64 class ids
    and labels up, the broadcast's availability mask [V, K] (bool) and cluster ids [M] (int64) down. F (M·V·P_f) is
    counted once: both Stage-II queries send it, the second to clients that already hold it."""
    source = PlantedSubspaces(clients_per_domain=layout)
    method = FKPL(threshold=10.0, basis=3, head_epochs=1, partner=partner)
    summary = head_federation(
        tmp_path, data=source, model=MLP(hidden=(8,)), rounds=2, method=method, local=_local()
    ).fit()
    clients = source.build(SEED).clients
    labels = records(tmp_path)[0]["cluster/labels"]
    assert labels == [int(c.domain[1:]) for c in clients]  # Stage 0 finds the 4 domains: V = 4
    m, v, k, t, d_x, p = sum(layout), 4, 3, 2, 16, 3
    p_w, p_f, d_v = (
        (16 * 8 + 8) + (8 * 3 + 3),
        16 * 8 + 8,
        4 * 8,
    )  # MLP(8) expert: Linear(16, 8) encoder + Linear(8, 3) head
    holders = [{labels[i] for i, c in enumerate(clients) if (c.train.y == cls).any()} for cls in range(k)]  # V_k
    k_m, v_k = sum(len(torch.unique(c.train.y)) for c in clients), sum(len(h) for h in holders)
    n_g = sum(len(c.train) if partner == "one" else sum(len(holders[y]) for y in c.train.y.tolist()) for c in clients)
    table9 = {
        "subspace": d_x * p * m,
        "experts": 2 * t * m * p_w,
        "encoder": m * v * p_f,
        "local": d_v * k_m,
        "domain": m * d_v * v_k,
        "virtual": n_g * d_v,
    }
    up, down = run_traffic(load_run(tmp_path))
    assert up == 4 * (table9["subspace"] + table9["experts"] // 2 + table9["local"] + table9["virtual"]) + 8 * (
        k_m + n_g
    )
    assert down == 4 * (table9["experts"] // 2 + table9["encoder"] + table9["domain"]) + m * (v * k + 8 * m)
    assert summary["query/fkpl/prototypes/bytes_down"] == 4 * table9["encoder"]  # F, once per client
    assert summary["query/fkpl/virtual/bytes_down"] == 4 * table9["domain"] + m * (v * k + 8 * m)  # not F again
    last = records(tmp_path)[-1]
    assert (last["stage2/encoder_scalars_down"], last["stage2/scalars_down/domain_prototypes"]) == (
        table9["encoder"],
        table9["domain"],
    )
    assert (last["stage2/scalars_up/virtual_features"], last["stage2/num_virtual"]) == (table9["virtual"], n_g)
    assert last["stage2/bytes_down"] == 4 * (table9["encoder"] + table9["domain"]) + m * (v * k + 8 * m)
