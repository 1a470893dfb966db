"""FKPL: Stage 0 angles and clustering, Stage I == FedAvg, Stage II virtual features and what leaves a client, resume
after a kill in each stage."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import flsuite.methods.fkpl.calibrate as calibrate
import flsuite.methods.fkpl.clustering as clustering
from flsuite.data.base import ClientData, DataSource, FederatedData, Split
from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.phases import Rounds
from flsuite.federation.query import QueryTask
from flsuite.interrupts import RunInterrupted
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl.cluster import angle_matrix, cluster, principal_angle, purity, threshold_scan
from flsuite.methods.fkpl.model import ConcatExperts, encode, encoder_weights, head_keys
from flsuite.methods.fkpl.subspace import SubspaceBasis, subspace_basis
from flsuite.models.heads import MLP
from tests.helpers import head_federation


class PlantedSubspaces(DataSource):
    """Each domain's inputs lie (up to 1e-3 noise) in its own random r-dim subspace of R^D; classes differ in their
    coefficients. 3 domains × 2 clients, or `clients_per_domain` as a list of counts (one domain each)."""

    def __init__(
        self,
        dim: int = 16,
        rank: int = 3,
        domains: int = 3,
        clients_per_domain: int | list[int] = 2,
        n: int = 30,
        classes: int = 3,
    ) -> None:
        self.cpd = [clients_per_domain] * domains if isinstance(clients_per_domain, int) else list(clients_per_domain)
        self.dim, self.rank, self.domains, self.n, self.classes = dim, rank, len(self.cpd), n, classes

    def build(self, seed: int) -> FederatedData:
        rng = np.random.default_rng(seed)
        centres = rng.normal(size=(self.classes, self.rank)) * 3

        def draw(basis, count):
            y = rng.integers(0, self.classes, count)
            x = (centres[y] + rng.normal(size=(count, self.rank))) @ basis.T + 1e-3 * rng.normal(size=(count, self.dim))
            return Split(torch.tensor(x, dtype=torch.float32), torch.tensor(y))

        clients, test = [], {}
        for d in range(self.domains):
            basis = np.linalg.qr(rng.normal(size=(self.dim, self.rank)))[0]
            for _ in range(self.cpd[d]):
                clients.append(ClientData(len(clients), f"d{d}", draw(basis, self.n)))
            test[f"d{d}"] = draw(basis, 20)
        return FederatedData(clients, test, num_classes=self.classes)


def fkpl_federation(run_dir, **method_kw):
    kw = {"threshold": 10.0, "basis": 3, "head_epochs": 3, "head_batch_size": 16, "virtual_per_sample": 2}
    kw.update(method_kw)
    return head_federation(
        run_dir, data=PlantedSubspaces(), model=MLP(hidden=(8,)), rounds=2, method=FKPL(**kw), local=_local()
    )


def _local():
    from flsuite.federation.task import LocalTraining

    return LocalTraining(epochs=1, batch_size=16, lr=0.05)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---- Stage 0 -----------------------------------------------------------------------------------------------------
def test_theta1_of_two_subspaces_at_a_known_angle():
    e = torch.eye(5, dtype=torch.float64)
    theta = math.radians(30.0)
    u = e[:, :2]
    v = torch.stack([math.cos(theta) * e[0] + math.sin(theta) * e[2], e[3]], dim=1)
    assert principal_angle(u, v) == pytest.approx(30.0, abs=1e-9)
    assert principal_angle(u, v, "pacfl") == pytest.approx(30.0, abs=1e-9)
    # the same plane in another basis: θ1 = 0 exactly; PACFL's entrywise arccos sees 45° (rotation) and 90° (sign flip)
    c = math.cos(math.pi / 4)
    rotated = u @ torch.tensor([[c, -c], [c, c]], dtype=torch.float64)
    assert principal_angle(u, rotated) == pytest.approx(0.0, abs=1e-5)
    assert principal_angle(u, rotated, "pacfl") == pytest.approx(45.0, abs=1e-9)
    assert principal_angle(u, -u) == pytest.approx(0.0, abs=1e-5)
    assert principal_angle(u, -u, "pacfl") == pytest.approx(90.0, abs=1e-9)
    # a client whose data lie in span(u) uploads a basis of that plane
    x = torch.randn(50, 2, dtype=torch.float64) @ u.T
    basis = subspace_basis(x, 10)
    assert basis.shape == (5, 2)  # truncated at the data's rank
    assert principal_angle(basis, u) == pytest.approx(0.0, abs=1e-2)
    assert principal_angle(basis, e[:, 2:3]) == pytest.approx(90.0, abs=1e-3)


def test_clustering_recovers_planted_subspaces_and_the_threshold_scan_moves_v_from_1_to_m():
    data = PlantedSubspaces().build(0)
    domains = [c.domain for c in data.clients]
    bases = [SubspaceBasis(p=3).compute(c, None, None)["basis"] for c in data.clients]
    angles = angle_matrix(bases)
    assert angles[0, 1] < 1.0 and angles[2, 3] < 1.0 and angles[0, 2] > 10.0  # same domain ~0°, different far apart
    labels = cluster(angles, threshold=5.0)
    assert labels == [0, 0, 1, 1, 2, 2]
    assert purity(labels, domains) == 1.0
    assert purity([0, 0, 0, 0, 1, 1], domains) == pytest.approx(4 / 6)
    scan = threshold_scan(angles, domains, [0.0, 5.0, 91.0])
    assert [r["num_clusters"] for r in scan] == [6, 3, 1]
    many = threshold_scan(angles, domains, np.linspace(0, 91, 40))
    vs = [r["num_clusters"] for r in many]
    assert vs[0] == 6 and vs[-1] == 1 and vs == sorted(vs, reverse=True)
    per_class = SubspaceBasis(p=6, per_class=True).compute(data.clients[0], None, None)["basis"]
    assert per_class.shape == (16, 6)  # 3 classes × 2 vectors, stacked


def test_stage0_logs_the_angle_heatmap_the_clusters_and_their_purity(tmp_path):
    fkpl_federation(tmp_path, head_epochs=1, personalized_heads=True).fit()
    assert (tmp_path / "fkpl_angles.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "fkpl_clusters.json").read_text())
    assert saved["clusters"] == [[0, 1], [2, 3], [4, 5]] and saved["purity"] == 1.0
    first = records(tmp_path)[0]
    assert (first["phase"], first["cluster/num_clusters"], first["cluster/purity"]) == ("cluster", 3, 1.0)
    assert first["bytes_up"] == 6 * 16 * 3 * 4  # M clients × d_x × p float32: only U_m leaves a client
    last = records(tmp_path)[-1]  # per-cluster heads: cluster v's clients are domain d<v>, so d<v> is served by head v
    assert all(last[f"personal/acc/d{v}"] == last[f"pcluster{v}/acc/d{v}"] for v in range(3))
    assert last["personal/acc_mean"] == pytest.approx(sum(last[f"pcluster{v}/acc/d{v}"] for v in range(3)) / 3)


# ---- Stage I -----------------------------------------------------------------------------------------------------
def test_stage1_with_one_cluster_is_plain_fedavg_bit_for_bit(tmp_path):
    fkpl_federation(tmp_path / "fkpl", assignment="single", head_epochs=1).fit()
    head_federation(
        tmp_path / "fedavg", data=PlantedSubspaces(), model=MLP(hidden=(8,)), rounds=2, method=FedAvg(), local=_local()
    ).fit()
    experts = [r for r in records(tmp_path / "fkpl") if r.get("phase") == "experts/expert0"]
    stripped = [{k.removeprefix("expert0/"): v for k, v in r.items() if k != "phase"} for r in experts]
    assert stripped == records(tmp_path / "fedavg")
    expert = load_checkpoint(tmp_path / "fkpl").outputs["experts/expert0"]["weights"]
    plain = load_checkpoint(tmp_path / "fedavg").global_weights
    assert expert.keys() == plain.keys() and all(torch.equal(expert[k], plain[k]) for k in plain)


def test_each_cluster_trains_its_own_expert_on_its_members_only(tmp_path):
    fkpl_federation(tmp_path, head_epochs=1).fit()
    for v, group in enumerate([[0, 1], [2, 3], [4, 5]]):
        rows = [r for r in records(tmp_path) if r.get("phase") == f"experts/expert{v}"]
        assert [r[f"expert{v}/clients"] for r in rows] == [group, group]
    # expert 1 is a FedAvg run restricted to clients 2 and 3
    head_federation(
        tmp_path / "sub",
        data=PlantedSubspaces(),
        model=MLP(hidden=(8,)),
        rounds=2,
        local=_local(),
        protocol=[Rounds(name="x", clients=[2, 3], method=FedAvg())],
    ).fit()
    got = load_checkpoint(tmp_path).outputs["experts/expert1"]["weights"]
    want = load_checkpoint(tmp_path / "sub").global_weights
    assert all(torch.equal(got[k], want[k]) for k in want)


# ---- Stage II ----------------------------------------------------------------------------------------------------
def _concat(num=2):
    data = PlantedSubspaces().build(0)
    torch.manual_seed(0)
    experts = [MLP(hidden=(4,)).build((16,), 3).state_dict() for _ in range(num)]
    enc = encoder_weights(experts, head_keys(MLP(hidden=(4,)).build((16,), 3)))
    model = ConcatExperts(MLP(hidden=(4,)), num, enc, with_head=False).build((16,), 3)
    return data, model, enc


def test_mixing_bounds_1_1_make_virtual_features_equal_the_real_features():
    data, model, _ = _concat()
    client = data.clients[2]
    protos = torch.randn(2, 3, 8)
    bc = {
        "protos": protos.reshape(6, 8),
        "has": torch.ones(2, 3, dtype=torch.bool),
        "cluster": torch.tensor([0, 0, 1, 1, 0, 1]),
    }
    real = encode(model, client.train.x)
    up = calibrate.VirtualFeatureQuery(1.0, 1.0, "feature", "one", 2).compute(client, QueryTask(2, 5, None, bc), model)
    assert torch.equal(up["features"], torch.cat([real, real])) and torch.equal(up["labels"], client.train.y.repeat(2))
    assert set(up) == {"features", "labels"}
    # (0, 0) gives the prototypes; partner "other" takes them from the other cluster (client 2 is in cluster 1)
    other = calibrate.VirtualFeatureQuery(0.0, 0.0, "feature", "other", 1).compute(
        client, QueryTask(2, 5, None, bc), model
    )
    assert torch.equal(other["features"], protos[0, client.train.y])
    # the official form weights the prototype: λ = 0 keeps the real feature
    official = calibrate.VirtualFeatureQuery(0.0, 0.0, "prototype", "one", 1).compute(
        client, QueryTask(2, 5, None, bc), model
    )
    assert torch.equal(official["features"], real)
    mixed = calibrate.VirtualFeatureQuery(0.5, 0.5, "feature", "other", 1).compute(
        client, QueryTask(2, 5, None, bc), model
    )
    torch.testing.assert_close(mixed["features"], 0.5 * real + 0.5 * protos[0, client.train.y])


def test_concatenated_encoder_is_frozen_and_drops_the_expert_heads():
    data, model, enc = _concat()
    # F's weights are exactly the experts' encoder layers ("1.*" of MLP(4)); their heads ("3.*") never travel
    assert set(enc) == {f"experts.{v}.1.{p}" for v in range(2) for p in ("weight", "bias")}
    assert set(model.state_dict()) == set(enc)
    assert model.dim == 8
    full = ConcatExperts(MLP(hidden=(4,)), 2, enc).build((16,), 3)
    assert [n for n, p in full.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    x = data.clients[0].train.x
    torch.testing.assert_close(full.features(x), encode(model, x))


def test_only_prototypes_and_virtual_features_leave_a_client_in_stage2(tmp_path):
    summary = fkpl_federation(tmp_path).fit()
    data = PlantedSubspaces().build(7)
    d_v = 3 * 8  # three experts, 8 features each
    held = sum(len(torch.unique(c.train.y)) for c in data.clients)
    samples = sum(len(c.train) for c in data.clients)
    assert summary["query/fkpl/prototypes/bytes_up"] == held * (d_v * 4 + 8)  # p_m^k (float32) and its class id
    assert summary["query/fkpl/virtual/bytes_up"] == 2 * samples * (d_v * 4 + 8)  # R = 2 (z̃, y) per sample
    last = records(tmp_path)[-1]
    assert last["phase"] == "calibrate" and last["stage2/scalars_up/virtual_features"] == 2 * samples * d_v
    assert last["stage2/bytes_up"] == summary["query/fkpl/prototypes/bytes_up"] + summary["query/fkpl/virtual/bytes_up"]
    assert (
        summary["fkpl/stage2/bytes_up"] == last["stage2/bytes_up"] and summary["fkpl/stage0/bytes_up"] > 0
    )  # Table 9 in summary.json
    assert summary["last5/acc_mean"] == last["acc_mean"] and "acc_std_sample" in last
    setup = json.loads((tmp_path / "setup.json").read_text())
    assert setup["fkpl/stage0/bytes_up"] == 6 * 16 * 3 * 4 and setup["fkpl/stage2/time/head_fit_s"] > 0


def test_the_federated_head_control_trains_only_the_head_over_frozen_experts(tmp_path):
    summary = fkpl_federation(tmp_path, head="federated", head_rounds=2).fit()
    rows = [r for r in records(tmp_path) if r.get("phase") == "calibrate/head"]
    head_bytes = (24 * 3 + 3) * 4
    assert [r["head/bytes_up"] for r in rows] == [6 * head_bytes] * 2
    assert summary["last/acc_mean"] == rows[-1]["head/acc_mean"]
    state = load_checkpoint(tmp_path)
    enc = encoder_weights(
        [state.outputs[f"experts/expert{v}"]["weights"] for v in range(3)], head_keys(MLP(hidden=(8,)).build((16,), 3))
    )
    final = state.outputs["calibrate/head"]["weights"]
    assert all(torch.equal(final[k], enc[k]) for k in enc)  # F unchanged by the federated rounds


def test_the_server_head_is_told_the_runs_configured_loop(tmp_path, monkeypatch):
    """The head's fit (`RoundServer.train`) knows the run's `local.loop` as configured, not as chosen: this run on
    `auto` chose lean for its clients and may still compile a long head (a run set to `lean` keeps it lean:
    tests/test_runtime.py)."""
    from flsuite.federation.server import RoundServer

    seen, train = [], RoundServer.train
    monkeypatch.setattr(RoundServer, "train", lambda self, *a, **k: seen.append(self.loop) or train(self, *a, **k))
    fkpl_federation(tmp_path).fit()
    assert load_checkpoint(tmp_path).local_loop.loop == "lean" and seen == ["auto"]


# ---- resume ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("full")
    fkpl_federation(run).fit()
    return run


@pytest.mark.parametrize("where", ["cluster", "experts", "prototypes", "virtual", "head"])
def test_a_kill_in_each_stage_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, uninterrupted, where):
    """Killed after Stage 0's bases were answered, in expert 1's round 2, after the prototype exchange but before the
    server stored its reduction (its bytes must not count twice), inside the virtual-feature exchange, and in the
    server head's fit."""
    fired: list[str] = []
    real_cluster, real_round, real_fit, real_compute = (
        clustering.cluster,
        Rounds._round,
        calibrate.fit_head,
        calibrate.VirtualFeatureQuery.compute,
    )
    real_protos = calibrate.domain_prototypes

    def trip(name):
        if name == where and not fired:
            fired.append(name)
            raise RunInterrupted()

    def cluster(*a, **k):
        trip("cluster")
        return real_cluster(*a, **k)

    def _round(self, ctx, rnd, *a, **k):
        if self.name == "experts/expert1" and rnd == 2:
            trip("experts")
        return real_round(self, ctx, rnd, *a, **k)

    def fit_head(*a, **k):
        trip("head")
        return real_fit(*a, **k)

    def compute(self, client, task, model):
        if client.client_id == 3:
            trip("virtual")
        return real_compute(self, client, task, model)

    def domain_prototypes(*a, **k):
        trip("prototypes")
        return real_protos(*a, **k)

    monkeypatch.setattr(clustering, "cluster", cluster)
    monkeypatch.setattr(calibrate, "domain_prototypes", domain_prototypes)
    monkeypatch.setattr(Rounds, "_round", _round)
    monkeypatch.setattr(calibrate, "fit_head", fit_head)
    monkeypatch.setattr(calibrate.VirtualFeatureQuery, "compute", compute)
    with pytest.raises(RunInterrupted):
        fkpl_federation(tmp_path).fit()
    assert fired == [where]
    summary = fkpl_federation(None).fit(resume=tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == (uninterrupted / "metrics.jsonl").read_text()
    full, resumed = load_checkpoint(uninterrupted), load_checkpoint(tmp_path)
    assert resumed.queries == full.queries and resumed.query_weights == full.query_weights
    assert summary["query/fkpl/virtual/calls"] == 1 and summary["query/fkpl/subspace/calls"] == 1
    for k in ("weight", "bias"):
        assert torch.equal(resumed.outputs["calibrate"]["head"][k], full.outputs["calibrate"]["head"][k])
