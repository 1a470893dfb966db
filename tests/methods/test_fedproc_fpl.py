"""FedProc and FPL: hand-computed losses, FINCH, the server's prototypes, and reductions to FedAvg."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.task import ClientResult
from flsuite.methods.fedproc import FedProc, mean_prototypes, prototype_contrastive_loss
from flsuite.methods.fpl import FPL, cluster_prototypes, finch, fpl_loss
from flsuite.models.heads import MLP
from tests.helpers import head_federation


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_bytes(rows):
    return [{k: v for k, v in r.items() if k not in ("bytes_up", "bytes_down")} for r in rows]


def result(k, protos, has):
    return ClientResult(
        k, 10, {}, upload={"protos": torch.tensor(protos, dtype=torch.float32), "has": torch.tensor(has)}
    )


# ---- FedProc -----------------------------------------------------------------------------------------------------
def test_fedproc_prototype_contrastive_loss_by_hand():
    protos = torch.tensor([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    has = torch.tensor([True, True, False])  # class 2 has no prototype: left out of the softmax
    z = torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    y = torch.tensor([0, 1, 2])
    # sample 0: cos = (1, 0) → −log(e/(e+1)); sample 1: cos = (1/√2, 1/√2) → log 2; sample 2: no prototype, counts in B
    want = (math.log(1 + math.exp(-1)) + math.log(2)) / 3
    assert float(prototype_contrastive_loss(z, y, protos, has)) == pytest.approx(want, rel=1e-6)
    assert float(prototype_contrastive_loss(z[:1], y[:1], protos, has, tau=0.5)) == pytest.approx(
        math.log(1 + math.exp(-2)), rel=1e-6
    )


def test_fedproc_alpha_decays_from_one_to_zero_over_the_schedule():
    m = FedProc(schedule_rounds=5)
    assert [m.alpha_at(t) for t in range(1, 6)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert FedProc(alpha=0.3).alpha_at(4) == 0.3
    with pytest.raises(ValueError, match="schedule_rounds must be >= 2"):
        FedProc(schedule_rounds=1)


def test_fedproc_server_prototypes_are_unweighted_means_over_the_clients_holding_the_class():
    got = mean_prototypes([result(0, [[1, 1], [0, 0]], [True, False]), result(1, [[3, 5], [2, 4]], [True, True])])
    torch.testing.assert_close(got["protos"], torch.tensor([[2.0, 3.0], [2.0, 4.0]]))
    assert got["has"].tolist() == [True, True]


def test_fedproc_with_alpha_zero_is_fedavg_but_for_the_uploaded_prototypes(tmp_path):
    head_federation(tmp_path / "proc", model=MLP(hidden=(6,)), method=FedProc(alpha=0.0)).fit()
    head_federation(tmp_path / "avg", model=MLP(hidden=(6,))).fit()
    proc, avg = records(tmp_path / "proc"), records(tmp_path / "avg")
    assert without_bytes(proc) == without_bytes(avg)
    # up: 3 classes × 6 float32 means + 3 bool flags per client (4 clients); down: from round 2, the prototypes and α
    assert [p["bytes_up"] - a["bytes_up"] for p, a in zip(proc, avg)] == [4 * (3 * 6 * 4 + 3)] * 3
    assert [p["bytes_down"] - a["bytes_down"] for p, a in zip(proc, avg)] == [0] + [4 * (3 * 6 * 4 + 3 + 4)] * 2
    w1, w2 = load_checkpoint(tmp_path / "proc").global_weights, load_checkpoint(tmp_path / "avg").global_weights
    assert all(torch.equal(w1[k], w2[k]) for k in w2)


def test_fedproc_schedule_changes_training_from_round_2(tmp_path):
    head_federation(tmp_path / "proc", model=MLP(hidden=(6,)), method=FedProc(schedule_rounds=3)).fit()
    head_federation(tmp_path / "avg", model=MLP(hidden=(6,))).fit()
    proc, avg = records(tmp_path / "proc"), records(tmp_path / "avg")
    assert without_bytes(proc[:1]) == without_bytes(avg[:1])  # round 1: no prototypes yet, plain CE
    assert proc[1]["train_loss"] != avg[1]["train_loss"]


# ---- FPL ---------------------------------------------------------------------------------------------------------
def test_finch_groups_first_neighbours_and_keeps_the_coarsest_partition_above_one():
    two = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert finch(two).tolist() == [0, 0, 1, 1]
    assert finch(two[:2]).tolist() == [0, 0]  # two points are each other's neighbour: one cluster
    # three tight pairs; the pair means are (almost) equally far apart, so the second level would merge all three:
    # FPL keeps the pairs
    pairs = np.array([[1, 0, 0], [1, 0.05, 0], [0, 1, 0], [0, 1, 0.05], [0, 0, 1], [0.05, 0, 1]], dtype=float)
    assert len(set(finch(pairs).tolist())) == 3


def test_fpl_cluster_and_unbiased_prototypes():
    # class 0: clients 0, 1 point one way, clients 2, 3 another → two cluster prototypes; class 1: only client 2 has it
    got = cluster_prototypes(
        [
            result(0, [[1.0, 0.0], [0, 0]], [True, False]),
            result(1, [[0.9, 0.1], [0, 0]], [True, False]),
            result(2, [[0.0, 1.0], [4, 4]], [True, True]),
            result(3, [[0.1, 0.9], [0, 0]], [True, False]),
        ]
    )
    assert got["mask"].tolist() == [[True, True], [True, False]]
    clusters = {tuple(round(v, 4) for v in got["protos"][0, i].tolist()) for i in range(2)}
    assert clusters == {(0.95, 0.05), (0.05, 0.95)}
    torch.testing.assert_close(got["unbiased"], torch.tensor([[0.5, 0.5], [4.0, 4.0]]))  # mean of the cluster means
    # three clients always form one FINCH cluster (each links to its nearest neighbour)
    three = cluster_prototypes([result(k, [[1.0, 0.0]] if k else [[0.0, 1.0]], [True]) for k in range(3)])
    assert three["mask"].tolist() == [[True]]


def test_fpl_loss_by_hand():
    protos = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    unbiased = torch.tensor([[0.5, 0.5], [-1.0, 0.0], [0.0, 0.0]])
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 2])  # sample 1's class has no prototype: contributes 0, counts in B
    e = math.e
    # sample 0, τ = 1: cos to (class 0: 1, 0), (class 1: −1) → −log((e + 1)/(e + 1 + 1/e)); MSE to (½, ½) = ¼
    want = (math.log((e + 1 + 1 / e) / (e + 1)) + 0.25) / 2
    loss = fpl_loss(z, y, protos, mask, unbiased, tau=1.0)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-6)
    loss.backward()
    assert torch.isfinite(z.grad).all() and torch.equal(z.grad[1], torch.zeros(2))


def test_fpl_round_one_is_fedavg_and_later_rounds_use_the_prototypes(tmp_path):
    head_federation(tmp_path / "fpl", model=MLP(hidden=(6,)), method=FPL()).fit()
    head_federation(tmp_path / "avg", model=MLP(hidden=(6,))).fit()
    fpl, avg = records(tmp_path / "fpl"), records(tmp_path / "avg")
    assert without_bytes(fpl[:1]) == without_bytes(avg[:1])
    assert fpl[0]["bytes_up"] - avg[0]["bytes_up"] == 4 * (3 * 6 * 4 + 3)
    assert fpl[1]["train_loss"] != avg[1]["train_loss"] and math.isfinite(fpl[2]["train_loss"])
    state = load_checkpoint(tmp_path / "fpl").server_state
    assert state["protos"].shape[0] == 3 and state["mask"].any(dim=1).all()
