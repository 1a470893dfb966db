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
    load_mapping,
    related_classes,
    select_classes,
)
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.server import PublicData
from flsuite.federation.task import LocalTraining
from flsuite.federation.weights import num_bytes
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedegg import (
    FedEGG,
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
    return PublicData(GaussianFeatures(**{"dim": 8, "num_classes": 3, "num_domains": 1, "clients_per_domain": 1, "samples_per_client": 90, **kw}))


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
    assert not torch.allclose(load_checkpoint(tmp_path / "on").global_weights["1.weight"], load_checkpoint(fedavg_run).global_weights["1.weight"], atol=1e-4)


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
    fed(tmp_path, rounds=6, executor=rec, server_steps=[FedEGG(guiding(), beta=beta, tau=-0.5)]).fit()
    hist = records(tmp_path)
    expected, prev = [], None
    for rnd in range(1, 7):
        results = rec.results[4 * (rnd - 1) : 4 * rnd]
        assert sorted(r.client_id for r in results) == sorted(hist[rnd - 1]["clients"])
        prev = momentum_loss(prev, [r.train_loss for r in results], beta)
        expected.append(prev)
    assert [r["server/fedegg/loss_c"] for r in hist] == pytest.approx(expected, rel=1e-12)
    for r in hist:
        assert r["server/fedegg/llr"] == pytest.approx(math.log2(r["server/fedegg/loss_c"] / prev_loss_g(hist, r)), rel=1e-12)
        assert r["server/fedegg/gate"] == int(r["server/fedegg/llr"] < r["server/fedegg/tau"])


def test_a_regularised_method_gates_on_its_clients_cross_entropy_not_on_its_objective(tmp_path):
    """FedProx + FedEGG: L^c is Eq. 6 over the clients' FL-task loss (`task_loss`), not over FedProx's objective
    with its proximal term (`train_loss`, larger by μ/2 · ‖w − w_g‖² on average)."""
    rec = Recording()
    fed(tmp_path, rounds=3, executor=rec, method=FedProx(mu=5.0), server_steps=[FedEGG(guiding(), beta=0.5, tau=-0.5)]).fit()
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


def prev_loss_g(hist: list[dict], record: dict) -> float:
    """L^g before this round's step: the previous record's (round 1: L(W₀, D^g), read back from the gate)."""
    i = hist.index(record)
    return hist[i - 1]["server/fedegg/loss_g"] if i else record["server/fedegg/loss_c"] / 2 ** record["server/fedegg/llr"]


def test_loss_g_changes_only_in_rounds_where_guiding_ran_and_a_latch_stops_for_good(tmp_path):
    fed(tmp_path / "a", rounds=10, server_steps=[FedEGG(guiding(), tau=-0.3)]).fit()
    hist = records(tmp_path / "a")
    gates = [r["server/fedegg/gate"] for r in hist]
    assert 0 < sum(gates) < len(gates), gates  # both kinds of rounds occur (the gate re-opens as L^c falls)
    loss_g = [prev_loss_g(hist, hist[0])] + [r["server/fedegg/loss_g"] for r in hist]
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
    assert state["tau"] == pytest.approx(2 * sum(tau_k) / 4 - 0.5, abs=1e-12) == pytest.approx(threshold(tau_k, 2.0, -0.5))
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
    fed(tmp_path / "r", rounds=1, server_steps=[FedEGG(guiding(), tau_form="remark")]).fit()
    tau = load_checkpoint(tmp_path / "r").step_states[0]["tau"]
    assert tau <= math.log2(1.5)  # log₂(2·cos − 0.5) with cos ≤ 1
    with pytest.raises(ValueError, match="rho \\* cos \\+ iota"):
        fed(tmp_path / "bad", rounds=1, server_steps=[FedEGG(guiding(), tau_form="remark", iota=-5.0)]).fit()


# ---- serial == Ray -----------------------------------------------------------------------------------------------
def test_serial_and_ray_runs_are_identical(tmp_path):
    ray = pytest.importorskip("ray")
    from flsuite.federation.ray_executor import RayExecutor

    fed(tmp_path / "serial", server_steps=[FedEGG(guiding(), tau=-0.3)]).fit()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        fed(tmp_path / "ray", executor=RayExecutor(num_workers=2), server_steps=[FedEGG(guiding(), tau=-0.3)]).fit()
    finally:
        ray.shutdown()
    assert (tmp_path / "ray" / "metrics.jsonl").read_bytes() == (tmp_path / "serial" / "metrics.jsonl").read_bytes()
    assert 0 < sum(r["server/fedegg/gate"] for r in records(tmp_path / "serial")) < 4


# ---- guiding sets (A6) -------------------------------------------------------------------------------------------
CIFAR10_MAPPING = Path(__file__).resolve().parents[2] / "configs" / "fedegg" / "mappings" / "cifar10_imagenet.json"


def test_the_shipped_cifar10_mapping_gives_the_a6_levels():
    mapping = load_mapping(CIFAR10_MAPPING)
    assert list(mapping) == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    assert sum(len(v) for v in mapping.values()) == 40 and len({w for v in mapping.values() for w in v}) == 35  # Table 5
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
    assert len(kept) == 3 and set(kept) < {"x", "w", "y", "v"} and kept == select_classes(mapping, "LH", [], seed=3, size=3)
    with pytest.raises(DataError, match="needs 4 unrelated pool classes, the pool has 2"):
        select_classes(mapping, "HH", ["p", "q", "x"], seed=0)


def test_a_guiding_set_relabels_the_chosen_source_classes_in_selection_order(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"mapping": {"0": ["near/0", "near/1"], "1": ["near/1", "near/2"], "2": ["near/2", "near/0"]}}))
    near = GaussianFeatures(dim=4, num_classes=3, num_domains=1, clients_per_domain=2, samples_per_client=50)
    far = GaussianFeatures(dim=4, num_classes=5, num_domains=1, clients_per_domain=1, samples_per_client=80, class_separation=9.0)
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
