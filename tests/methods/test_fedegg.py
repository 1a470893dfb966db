"""FedEGG: Remark 3.9 (no guidance = FedAvg, and X + FedEGG without guidance = X), the LLR gate, Eq. 6's momentum,
L^g refreshed only when guiding ran, τ (Eqs. 2-3) rising with the clients' cosine similarity, bytes, serial == Ray."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from flsuite.data.base import DataError
from flsuite.data.builtin import GaussianFeatures
from flsuite.data.guiding import (
    ClassFolder,
    GuidingSet,
    fl_labels,
)
from flsuite.data.guiding_selection import (
    load_mapping,
    related_classes,
    select_classes,
)
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.server import PublicData
from flsuite.federation.task import LocalTraining
from flsuite.federation.weights import num_bytes
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedegg import FedEGG
from flsuite.methods.fedegg_equations import (
    gate_open,
    llr,
    log2_cos,
    mean_feature,
    momentum_loss,
    threshold,
)
from flsuite.methods.fedprox import FedProx
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP
from tests.helpers import head_federation, initial_weights
from tests.methods.test_baselines import Recording

SGD = LocalTraining(epochs=1, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)


def fed(run_dir, **overrides):
    """4 clients, an MLP (post-ReLU features), plain SGD, FedAvg with Eq. 5's uniform weights."""
    kwargs = {"model": MLP(hidden=(16,)), "local": SGD, "method": FedAvg(weighting="uniform"), "rounds": 4}
    kwargs.update(overrides)
    return head_federation(run_dir, **kwargs)


def guiding(**kw) -> PublicData:
    """A related guiding set: the federation's own class means (same dim, classes and seed), its own samples."""
    return PublicData(
        GaussianFeatures(
            **{"dim": 8, "num_classes": 3, "num_domains": 1, "clients_per_domain": 1, "samples_per_client": 90, **kw}
        )
    )


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def strip(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("server/fedegg/")} for r in history]


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fedavg")
    fed(run_dir).fit()
    return run_dir


# ---- Remark 3.9: no guidance is FedAvg -------------------------------------------------------------------------
@pytest.mark.parametrize("off", [{"tau": 10.0, "lr_scale": 0.0}, {"tau": -math.inf}], ids=["gamma0", "tau-inf"])
def test_without_guidance_the_run_is_fedavg_bit_for_bit(tmp_path, fedavg_run, off):
    fed(tmp_path / "off", server_steps=[FedEGG(guiding(), **off)]).fit()
    ours = records(tmp_path / "off")
    assert strip(ours) == records(fedavg_run)  # every metric but FedEGG's own log, to the last bit
    assert same_weights(load_checkpoint(tmp_path / "off").global_weights, load_checkpoint(fedavg_run).global_weights)
    assert [r["server/fedegg/gate"] for r in ours] == ([1] * 4 if "lr_scale" in off else [0] * 4)
    # the same step with γ = η guides and changes the model
    fed(tmp_path / "on", server_steps=[FedEGG(guiding(), tau=10.0)]).fit()
    assert not torch.allclose(
        load_checkpoint(tmp_path / "on").global_weights["1.weight"],
        load_checkpoint(fedavg_run).global_weights["1.weight"],
        atol=1e-4,
    )


def test_scaffold_plus_fedegg_without_guidance_is_scaffold(tmp_path):
    fed(tmp_path / "s", method=Scaffold()).fit()
    fed(tmp_path / "sg", method=Scaffold(), server_steps=[FedEGG(guiding(), tau=-math.inf)]).fit()
    assert strip(records(tmp_path / "sg")) == records(tmp_path / "s")
    a, b = load_checkpoint(tmp_path / "s"), load_checkpoint(tmp_path / "sg")
    assert same_weights(a.global_weights, b.global_weights) and same_weights(a.server_state["c"], b.server_state["c"])
    for k in a.client_states:
        assert same_weights(a.client_states[k]["c_i"], b.client_states[k]["c_i"])
    # guiding on: the broadcast model changes, SCAFFOLD's control variates stay SCAFFOLD's (computed by its clients)
    fed(tmp_path / "on", method=Scaffold(), server_steps=[FedEGG(guiding(), tau=10.0)]).fit()
    assert not same_weights(load_checkpoint(tmp_path / "on").global_weights, a.global_weights)


# ---- the gate, Eq. 6 and L^g -----------------------------------------------------------------------------------
def test_the_gate_opens_iff_the_log_loss_ratio_is_below_tau():
    assert llr(1.0, 2.0) == -1.0
    assert not gate_open(1.0, 2.0, tau=-1.0)  # equal: closed (strict <)
    assert gate_open(1.0, 2.0, tau=-0.999)
    assert not gate_open(1.0, 2.0, tau=-1.001)
    assert gate_open(1.0, 8.0, tau=-2.5) and not gate_open(1.0, 4.0, tau=-2.5)  # L^g > L^c · 2^(−τ) ⇔ guide
    assert not gate_open(5.0, 1.0, tau=-math.inf)


def test_eq6_momentum_on_a_hand_example():
    assert momentum_loss(None, [2.0, 4.0], beta=0.9) == 3.0  # first round: the mean (A4)
    assert momentum_loss(3.0, [1.0, 2.0], beta=0.9) == pytest.approx(0.9 * 3.0 + 0.1 * 1.5, abs=1e-15)
    assert momentum_loss(3.0, [1.0, 2.0], beta=0.0) == 1.5


def test_loss_c_follows_eq6_from_the_clients_losses_and_the_gate_follows_eq8_every_round(tmp_path):
    rec = Recording()
    beta = 0.5
    f = fed(tmp_path, rounds=6, executor=rec, server_steps=[FedEGG(guiding(), beta=beta, tau=-0.5)])
    f.fit()
    hist, loss_g0 = records(tmp_path), initial_loss_g(f, f.server_steps[0])
    expected, prev = [], None
    for rnd in range(1, 7):
        results = rec.results[4 * (rnd - 1) : 4 * rnd]
        assert sorted(r.client_id for r in results) == sorted(hist[rnd - 1]["clients"])
        prev = momentum_loss(prev, [r.train_loss for r in results], beta)
        expected.append(prev)
    assert [r["server/fedegg/loss_c"] for r in hist] == pytest.approx(expected, rel=1e-12)
    for r in hist:
        assert r["server/fedegg/llr"] == pytest.approx(
            math.log2(r["server/fedegg/loss_c"] / prev_loss_g(hist, r, loss_g0)), rel=1e-6
        )  # L^g: a float32 sum
        assert r["server/fedegg/gate"] == int(r["server/fedegg/llr"] < r["server/fedegg/tau"])


def test_a_regularised_method_gates_on_its_clients_cross_entropy_not_on_its_objective(tmp_path):
    """FedProx + FedEGG: L^c is Eq. 6 over the clients' FL-task loss (`task_loss`), not over FedProx's objective
    with its proximal term (`train_loss`, larger by μ/2 · ‖w − w_g‖² on average)."""
    rec = Recording()
    fed(
        tmp_path, rounds=3, executor=rec, method=FedProx(mu=5.0), server_steps=[FedEGG(guiding(), beta=0.5, tau=-0.5)]
    ).fit()
    hist, prev = records(tmp_path), None
    for rnd, record in enumerate(hist, 1):
        results = rec.results[4 * (rnd - 1) : 4 * rnd]
        prev = momentum_loss(prev, [r.task_loss for r in results], 0.5)
        assert record["server/fedegg/loss_c"] == pytest.approx(prev, rel=1e-12)
        assert all(r.train_loss > r.task_loss for r in results)


def test_a_loss_ratio_without_a_logarithm_is_refused_with_the_values():
    with pytest.raises(ValueError, match=r"positive, finite losses.*L\^c = -0.006.*L\^g = 1.5"):
        llr(-0.006, 1.5)
    with pytest.raises(ValueError, match=r"L\^g = nan"):
        llr(1.0, math.nan)


def initial_loss_g(f, step: FedEGG) -> float:
    """L^g₀ = L(W₀, D^g) by hand: mean cross-entropy of the seeded fresh guiding head on the trunk's features of every
    guiding sample (the step's eval_size must cover D^g)."""
    data = f.data.build(f.seed)
    model = f.model.build(data.input_shape, data.num_classes)
    model.load_state_dict(initial_weights(f, data))
    split = step.data.build(f.seed)
    head = step._new_head(16, f.seed)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(head(model.features(split.x)).double(), split.y))


def prev_loss_g(hist: list[dict], record: dict, loss_g0: float) -> float:
    """L^g before this round's step: the previous record's (round 1: L^g₀)."""
    i = hist.index(record)
    return hist[i - 1]["server/fedegg/loss_g"] if i else loss_g0


def test_loss_g_changes_only_in_rounds_where_guiding_ran_and_a_latch_stops_for_good(tmp_path):
    f = fed(tmp_path / "a", rounds=10, server_steps=[FedEGG(guiding(), tau=-0.3)])
    f.fit()
    hist = records(tmp_path / "a")
    gates = [r["server/fedegg/gate"] for r in hist]
    assert 0 < sum(gates) < len(gates), gates  # both kinds of rounds occur (the gate re-opens as L^c falls)
    loss_g = [initial_loss_g(f, f.server_steps[0])] + [r["server/fedegg/loss_g"] for r in hist]
    for i, gate in enumerate(gates):
        assert (loss_g[i + 1] != loss_g[i]) == bool(gate), (i, gates)
    state = load_checkpoint(tmp_path / "a").step_states[0]
    assert state["rounds_guided"] == sum(gates)
    fed(tmp_path / "latch", rounds=10, server_steps=[FedEGG(guiding(), tau=-0.3, latch=True)]).fit()
    latched = [r["server/fedegg/gate"] for r in records(tmp_path / "latch")]
    first_closed = latched.index(0)
    assert latched == [1] * first_closed + [0] * (10 - first_closed)


# ---- τ (Eqs. 2-3) ------------------------------------------------------------------------------------------------
def test_tau_is_eq3_of_the_clients_log_cosines_under_w0_and_its_bytes_are_counted(tmp_path):
    f = fed(tmp_path, rounds=1, server_steps=[FedEGG(guiding())])
    summary = f.fit()
    state = load_checkpoint(tmp_path).step_states[0]
    data = f.data.build(f.seed)
    model = f.model.build(data.input_shape, data.num_classes)
    model.load_state_dict(copy.deepcopy(initial_weights(f, data)))
    g = mean_feature(model, guiding().build(f.seed).x).to(torch.float32)  # F travels in float32
    tau_k = [log2_cos(mean_feature(model, c.train.x), g) for c in data.clients]
    assert state["tau_k"] == pytest.approx(tau_k, abs=1e-12)
    assert (
        state["tau"] == pytest.approx(2 * sum(tau_k) / 4 - 0.5, abs=1e-12) == pytest.approx(threshold(tau_k, 2.0, -0.5))
    )
    assert summary["query/fedegg/tau/bytes_up"] == 4 * 8  # one float64 τ_k per client
    assert summary["query/fedegg/tau/bytes_down"] == 4 * (16 * 4 + num_bytes(initial_weights(f, data)))  # F and W₀


def test_tau_increases_with_the_clients_cosine_similarity(tmp_path):
    taus = []
    for k, shift in enumerate([0.0, 3.0, 10.0]):  # the guiding set moves away from the clients' data
        fed(tmp_path / str(k), rounds=1, server_steps=[FedEGG(guiding(domain_shift=1.0 + shift))]).fit()
        taus.append(load_checkpoint(tmp_path / str(k)).step_states[0]["tau"])
    assert taus[0] > taus[1] > taus[2], taus
    assert threshold([-0.1, -0.2], 2, -0.5) > threshold([-0.3, -0.2], 2, -0.5)


def test_remark_form_and_its_undefined_case(tmp_path):
    f = fed(tmp_path / "r", rounds=1, server_steps=[FedEGG(guiding(), tau_form="remark")])
    f.fit()
    tau = load_checkpoint(tmp_path / "r").step_states[0]["tau"]
    data = f.data.build(f.seed)
    model = f.model.build(data.input_shape, data.num_classes)
    model.load_state_dict(initial_weights(f, data))
    clients = torch.stack([mean_feature(model, c.train.x).float().double() for c in data.clients]).mean(
        0
    )  # uploads: float32
    cos = torch.nn.functional.cosine_similarity(clients, mean_feature(model, guiding().build(f.seed).x), dim=0)
    assert tau == pytest.approx(math.log2(2.0 * float(cos) - 0.5), abs=1e-12)  # log₂(ρ · cos(mean_k f̄_k, F) + ι)
    with pytest.raises(ValueError, match="rho \\* cos \\+ iota"):
        fed(tmp_path / "bad", rounds=1, server_steps=[FedEGG(guiding(), tau_form="remark", iota=-5.0)]).fit()


# ---- serial == Ray -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_serial_and_ray_runs_are_identical(tmp_path, local_ray):
    from flsuite.federation.ray_executor import RayExecutor

    fed(tmp_path / "serial", server_steps=[FedEGG(guiding(), tau=-0.3)]).fit()
    fed(
        tmp_path / "ray",
        executor=RayExecutor(num_workers=2, keep_workers=True),
        server_steps=[FedEGG(guiding(), tau=-0.3)],
    ).fit()
    assert (tmp_path / "ray" / "metrics.jsonl").read_bytes() == (tmp_path / "serial" / "metrics.jsonl").read_bytes()
    assert 0 < sum(r["server/fedegg/gate"] for r in records(tmp_path / "serial")) < 4


# ---- guiding sets (A6) -------------------------------------------------------------------------------------------
CIFAR10_MAPPING = Path(__file__).resolve().parents[2] / "configs" / "fedegg" / "mappings" / "cifar10_imagenet.json"


def test_the_shipped_cifar10_mapping_gives_the_a6_levels():
    mapping = load_mapping(CIFAR10_MAPPING)
    assert list(mapping) == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    assert (
        sum(len(v) for v in mapping.values()) == 40 and len({w for v in mapping.values() for w in v}) == 35
    )  # Table 5
    pool = [f"n{i:08d}" for i in range(1000)] + [w for v in mapping.values() for w in v]
    lh = select_classes(mapping, "LH", pool, seed=0)
    assert lh == [v[0] for v in mapping.values()] + [v[1] for v in mapping.values()] and len(set(lh)) == 20
    mh = select_classes(mapping, "MH", pool, seed=0)
    assert mh[:10] == lh[:10] and not set(mh[10:]) & set(lh) and len(set(mh)) == 20
    assert mh == select_classes(mapping, "MH", pool, seed=0) != select_classes(mapping, "MH", pool, seed=1)
    hh = select_classes(mapping, "HH", pool, seed=0)
    assert len(set(hh)) == 20 and not set(hh) & set(lh)


def test_a_duplicate_falls_through_to_the_next_rank_and_size_keeps_a_seeded_subset():
    mapping = {"a": ["x", "y", "z"], "b": ["x", "w", "y", "v"]}
    assert related_classes(mapping, per_class=2) == ["x", "w", "y", "v"]
    with pytest.raises(DataError, match="FL class 'b' has fewer than 2 distinct"):
        related_classes({"a": ["x", "y", "z"], "b": ["x", "y", "z"]}, per_class=2)
    kept = select_classes(mapping, "LH", [], seed=3, size=3)
    assert (
        len(kept) == 3
        and set(kept) < {"x", "w", "y", "v"}
        and kept == select_classes(mapping, "LH", [], seed=3, size=3)
    )
    with pytest.raises(DataError, match="needs 4 unrelated pool classes, the pool has 2"):
        select_classes(mapping, "HH", ["p", "q", "x"], seed=0)


def test_a_guiding_set_relabels_the_chosen_source_classes_in_selection_order(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(
        json.dumps({"mapping": {"0": ["near/0", "near/1"], "1": ["near/1", "near/2"], "2": ["near/2", "near/0"]}})
    )
    near = GaussianFeatures(dim=4, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=50)
    far = GaussianFeatures(
        dim=4, num_classes=5, num_domains=1, clients_per_domain=1, samples_per_client=80, class_separation=9.0
    )
    sources = {"near": near, "far": far}
    lh = GuidingSet(path, "LH", sources, pool=["far"], per_class=1).build(seed=4)
    assert lh.classes == ("near/0", "near/1", "near/2") and len(lh.clients) == 1
    pooled = near.build(0)  # public data: built with the GuidingSet seed (0), whatever the run seed
    x = torch.cat([c.train.x for c in pooled.clients])
    y = torch.cat([c.train.y for c in pooled.clients])
    for label in range(3):
        assert torch.equal(lh.clients[0].train.x[lh.clients[0].train.y == label], x[y == label])
    mh = GuidingSet(path, "MH", sources, pool=["far"], per_class=1).build(seed=4)
    assert mh.classes[0] == "near/0" and all(c.startswith("far/") for c in mh.classes[1:]) and len(mh.classes) == 3
    hh = GuidingSet(path, "HH", sources, pool=["far"], per_class=1, hh_size=5, max_per_class=7).build(seed=4)
    assert sorted(hh.classes) == [f"far/{k}" for k in range(5)]
    assert torch.bincount(hh.clients[0].train.y).tolist() == [7] * 5
    with pytest.raises(DataError, match="'near/9': source 'near' has no class '9'"):
        path.write_text(json.dumps({"mapping": {"0": ["near/9"]}}))
        GuidingSet(path, "LH", sources, per_class=1).build(seed=4)


def test_a_class_folder_source_decodes_only_the_chosen_classes(tmp_path):
    from PIL import Image

    for k, wnid in enumerate(["n01", "n02", "n03", "n04", "n05"]):
        (tmp_path / "train" / wnid).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (12, 10), (40 * k, 10 * i, 0)).save(tmp_path / "train" / wnid / f"{i}.png")
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"mapping": {"a": ["n03", "n01"], "b": ["n03", "n05"]}}))
    source = ClassFolder(tmp_path / "train", image_size=8, max_per_class=3, test_fraction=0.34)
    assert source.class_names() == ["n01", "n02", "n03", "n04", "n05"]
    assert source.build_classes(["n03"], seed=0).classes == ("n03",)
    lh = GuidingSet(path, "LH", {"imagenet": source}, per_class=1).build(seed=0)
    assert lh.classes == ("n03", "n05") and lh.clients[0].train.x.shape == (4, 3, 8, 8)  # 3 per class, 1 held out
    torch.testing.assert_close(lh.clients[0].train.x[0, 0], torch.full((8, 8), 80 / 255))  # class n03 (k = 2) red
    hh = GuidingSet(path, "HH", {"imagenet": source}, per_class=1).build(seed=0)
    assert set(hh.classes) <= {"n01", "n02", "n04"} and len(hh.classes) == 2


# ---- the guiding step: which weights it moves, by how much, at which rate ----------------------------------------
def test_the_fl_head_is_untouched_by_guiding_and_the_update_ratio_is_the_norms_quotient(tmp_path):
    """One round, the same clients: guided (τ = 10) and unguided (τ = −∞) runs share W̄_1. The FL head ("3.*") of
    W_1 is W̄_1's to the bit; the trunk moved; update_ratio = ‖W_1 − W̄_1‖ / ‖W̄_1 − W₀‖ by hand."""
    f = fed(tmp_path / "on", rounds=1, server_steps=[FedEGG(guiding(), tau=10.0)])
    w0 = initial_weights(f)
    f.fit()
    fed(tmp_path / "off", rounds=1, server_steps=[FedEGG(guiding(), tau=-math.inf)]).fit()
    guided, aggregated = (
        load_checkpoint(tmp_path / "on").global_weights,
        load_checkpoint(tmp_path / "off").global_weights,
    )
    assert torch.equal(guided["3.weight"], aggregated["3.weight"]) and torch.equal(
        guided["3.bias"], aggregated["3.bias"]
    )
    assert not torch.equal(guided["1.weight"], aggregated["1.weight"])

    def norm(a, b):
        return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))

    (on,), (off,) = records(tmp_path / "on"), records(tmp_path / "off")
    assert on["server/fedegg/update_ratio"] == pytest.approx(norm(guided, aggregated) / norm(aggregated, w0), rel=1e-9)
    assert on["server/fedegg/update_ratio"] > 0
    assert off["server/fedegg/update_ratio"] == 0.0


def test_a_guided_step_lowers_the_guiding_loss_and_its_size_follows_gamma(tmp_path):
    """L^g after the step (logged) is below L(W̄_1, D^g) under the same (untrained) guiding head; one SGD step is
    linear in γ, so doubling lr_scale doubles update_ratio."""
    f = fed(tmp_path / "off", rounds=1, server_steps=[FedEGG(guiding(), tau=-math.inf, eval_size=None)])
    f.fit()
    step = f.server_steps[0]
    model = f.model.build((8,), 3)
    model.load_state_dict(load_checkpoint(tmp_path / "off").global_weights)
    before = step._guiding_loss(model, step._new_head(16, f.seed))  # the head is the fresh one until guiding runs
    ratios = []
    for scale in (1.0, 2.0):
        fed(
            tmp_path / str(scale), rounds=1, server_steps=[FedEGG(guiding(), tau=10.0, eval_size=None, lr_scale=scale)]
        ).fit()
        (record,) = records(tmp_path / str(scale))
        assert record["server/fedegg/loss_g"] < before
        ratios.append(record["server/fedegg/update_ratio"])
    assert ratios[1] == pytest.approx(2 * ratios[0], rel=1e-4)


def test_gamma_follows_the_local_rate_across_its_drop(tmp_path):
    local = LocalTraining(
        epochs=1, batch_size=16, lr=0.05, lr_milestones=[3], lr_gamma=0.1, momentum=0.0, weight_decay=0.0
    )
    fed(tmp_path, rounds=4, local=local, server_steps=[FedEGG(guiding(), tau=10.0, lr_scale=0.5)]).fit()
    assert [r["server/fedegg/lr"] for r in records(tmp_path)] == pytest.approx(
        [0.025, 0.025, 0.0025, 0.0025], rel=1e-15
    )


class BatchNormMLP(MLP):
    """Flatten → Linear(8, 16) → BatchNorm1d → ReLU → Linear(16, C): a trunk with BatchNorm statistics."""

    def build(self, input_shape, num_classes):
        from flsuite.models.heads import SequentialClassifier

        return SequentialClassifier(
            torch.nn.Flatten(),
            torch.nn.Linear(8, 16),
            torch.nn.BatchNorm1d(16),
            torch.nn.ReLU(),
            torch.nn.Linear(16, num_classes),
        )


@pytest.mark.parametrize("freeze_bn", [False, True])
def test_freeze_bn_keeps_the_running_statistics_through_guiding(tmp_path, freeze_bn):
    fed(tmp_path / "off", rounds=1, model=BatchNormMLP(), server_steps=[FedEGG(guiding(), tau=-math.inf)]).fit()
    fed(
        tmp_path / "on", rounds=1, model=BatchNormMLP(), server_steps=[FedEGG(guiding(), tau=10.0, freeze_bn=freeze_bn)]
    ).fit()
    aggregated, guided = (
        load_checkpoint(tmp_path / "off").global_weights,
        load_checkpoint(tmp_path / "on").global_weights,
    )
    for key in ("2.running_mean", "2.running_var", "2.num_batches_tracked"):
        assert torch.equal(guided[key], aggregated[key]) == freeze_bn, key
    assert not torch.equal(guided["2.weight"], aggregated["2.weight"])  # the affine weights train either way


# ---- shared_head (spec A1) ---------------------------------------------------------------------------------------
def mapped_guiding(tmp_path, level="LH") -> PublicData:
    """A GuidingSet over a related Gaussian source, its FL classes listed in another order than the federation's:
    guiding labels 0, 1, 2 = near/1, near/2, near/0, chosen for FL "2", "0", "1"; an unrelated source for MH."""
    path = tmp_path / "map.json"
    path.write_text(
        json.dumps({"fl_classes": ["2", "0", "1"], "mapping": {"2": ["near/1"], "0": ["near/2"], "1": ["near/0"]}})
    )
    near = GaussianFeatures(dim=8, num_classes=3, num_domains=1, clients_per_domain=1, samples_per_client=90)
    far = GaussianFeatures(
        dim=8, num_classes=4, num_domains=1, clients_per_domain=1, samples_per_client=40, class_separation=9.0
    )
    return PublicData(GuidingSet(path, level, {"near": near, "far": far}, pool=["far"], per_class=1))


def test_a_guiding_set_records_the_fl_class_each_guiding_class_was_chosen_for(tmp_path):
    lh = mapped_guiding(tmp_path).source.build(0)
    assert lh.classes == ("near/1", "near/2", "near/0") and lh.description["fl_classes"] == ["2", "0", "1"]
    mh = mapped_guiding(tmp_path, "MH").source.build(0)
    assert mh.description["fl_classes"][0] == "2" and mh.description["fl_classes"][1:] == [None, None]
    assert fl_labels(lh, ("0", "1", "2")).tolist() == [2, 0, 1]
    assert fl_labels(lh, ("2", "1", "0")).tolist() == [0, 2, 1]  # by name, not position
    with pytest.raises(DataError, match=r"guiding classes \['far/\d', 'far/\d'\] were chosen for no FL class"):
        fl_labels(mh, ("0", "1", "2"))
    with pytest.raises(
        DataError, match=r"FL classes \['0', '1', '2'\] are not classes of the federation's data \['a', 'b', 'c'\]"
    ):
        fl_labels(lh, ("a", "b", "c"))
    with pytest.raises(DataError, match="does not say which FL class each guiding class stands for"):
        fl_labels(guiding().source.build(0), ("0", "1", "2"))


def test_shared_head_trains_the_fl_head_on_the_mapped_labels(tmp_path):
    f = fed(
        tmp_path / "shared",
        rounds=1,
        server_steps=[FedEGG(mapped_guiding(tmp_path), tau=10.0, shared_head=True, eval_size=None)],
    )
    f.fit()
    fed(tmp_path / "off", rounds=1, server_steps=[FedEGG(mapped_guiding(tmp_path), tau=-math.inf)]).fit()
    shared, aggregated = load_checkpoint(tmp_path / "shared"), load_checkpoint(tmp_path / "off").global_weights
    assert not torch.equal(shared.global_weights["3.weight"], aggregated["3.weight"])  # the FL head moved
    assert shared.step_states[0]["head"] is None  # no guiding head
    # L^g is the FL model's cross-entropy on D^g relabelled to FL labels (guiding 0, 1, 2 -> FL 2, 0, 1)
    split = mapped_guiding(tmp_path).build(0)
    model = f.model.build((8,), 3)
    model.load_state_dict(shared.global_weights)
    with torch.no_grad():
        expected = float(torch.nn.functional.cross_entropy(model(split.x).double(), torch.tensor([2, 0, 1])[split.y]))
    assert records(tmp_path / "shared")[0]["server/fedegg/loss_g"] == pytest.approx(expected, rel=1e-6)
    with pytest.raises(DataError, match="chosen for no FL class"):
        fed(tmp_path / "mh", rounds=1, server_steps=[FedEGG(mapped_guiding(tmp_path, "MH"), shared_head=True)]).fit()
