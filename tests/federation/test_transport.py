"""What a method declares travelling is what travels (issue 34): a result carries only the weights declared up, a task
only those declared down, entries kept on the client travel neither way, and `aggregate` never sees the rest."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch

from flsuite.federation.checkpoint import load_checkpoint
from flsuite.federation.executors import SerialExecutor
from flsuite.federation.local.client import load_task_weights
from flsuite.federation.task import ClientResult, ClientTask
from flsuite.federation.transport import Transport
from flsuite.federation.weights import num_bytes
from flsuite.methods.fedsr import REFERENCE, FedSR, FedSRModel
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import Linear, SmallCNN
from tests.helpers import cnn_federation, head_federation


class SeenByScaffold(Scaffold):
    """SCAFFOLD that records, per round, the weights and uploads its `aggregate` receives."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[ClientResult]] = []

    def aggregate(self, round, global_weights, results, server_state, ctx=None):
        self.seen.append(copy.deepcopy(list(results)))
        return super().aggregate(round, global_weights, results, server_state, ctx)


def test_scaffold_aggregate_sees_only_delta_y_delta_c_and_the_float_buffers(tmp_path):
    """A CNN with BatchNorm: every result's weights are exactly its running means and variances (no parameter, no
    integer `num_batches_tracked`), its upload exactly Δy and Δc over the trainable parameters; `bytes_up` counts
    those and nothing else."""
    method = SeenByScaffold()
    fed = cnn_federation(tmp_path, rounds=2, method=method, model=SmallCNN(channels=(4,), hidden=8, batch_norm=True))
    fed.fit()
    model = SmallCNN(channels=(4,), hidden=8, batch_norm=True).build((1, 8, 8), 10)
    params = [n for n, _ in model.named_parameters()]
    float_buffers = [n for n, b in model.named_buffers() if torch.is_floating_point(b)]
    assert float_buffers == ["1.running_mean", "1.running_var"] and "1.num_batches_tracked" in model.state_dict()
    assert len(method.seen) == 2 and all(len(results) == 4 for results in method.seen)
    for results in method.seen:
        for r in results:
            assert list(r.weights) == float_buffers
            assert set(r.upload) == {"delta_y", "delta_c"}
            assert list(r.upload["delta_y"]) == list(r.upload["delta_c"]) == params
            assert (
                method.bytes_up(r)
                == num_bytes(r.weights) + num_bytes(r.upload)
                == 2 * sum(p.numel() * 4 for p in model.parameters()) + 2 * 4 * 4
            )


class Recording(SerialExecutor):
    """Keeps every task and result."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[ClientTask] = []
        self.results: list[ClientResult] = []

    def run(self, tasks: Sequence[ClientTask]):
        self.tasks.extend(tasks)
        results = super().run(tasks)
        self.results.extend(r for r in results if isinstance(r, ClientResult))
        return results


def test_fedsr_references_kept_on_the_client_travel_neither_way(tmp_path):
    """FedSR `per_client`: r_μ, r_σ and C are in no task (neither carried nor held) and no result, and each client
    trains its own (its state's copy differs from the global one, which stays W₀'s)."""
    rec = Recording()
    fed = head_federation(
        tmp_path, rounds=2, method=FedSR(l2r=0.1, cmi=0.05), model=FedSRModel(hidden=[8], dim=4), executor=rec
    )
    fed.fit()
    everything = set(FedSRModel(hidden=[8], dim=4).build((8,), 3).state_dict())
    assert set(REFERENCE) < everything
    assert len(rec.tasks) == len(rec.results) == 8
    for t in rec.tasks:
        assert set(t.global_weights) == everything - set(REFERENCE) and t.held == {}
    for r in rec.results:
        assert set(r.weights) == everything - set(REFERENCE)
        assert set(r.state["reference"]) == set(REFERENCE)
        assert not torch.equal(r.state["reference"]["r_mu"], torch.zeros_like(r.state["reference"]["r_mu"]))
    final = load_checkpoint(tmp_path).global_weights
    assert torch.equal(final["r_mu"], torch.zeros_like(final["r_mu"])) and torch.equal(final["C"], torch.ones(()))


def test_trainable_down_carries_the_trainable_parameters_and_the_client_holds_the_rest():
    weights = {
        "a.weight": torch.ones(2),
        "a.bias": torch.ones(1),
        "bn.running_mean": torch.zeros(2),
        "bn.count": torch.tensor(3),
    }
    carried, held = Transport(down="trainable", trainable=("a.weight", "a.bias")).downward(weights)
    assert list(carried) == ["a.weight", "a.bias"] and list(held) == ["bn.running_mean", "bn.count"]
    carried, held = Transport(trainable=("a.weight", "a.bias")).downward(weights)
    assert carried is weights and held == {}  # "all": the global weights themselves, one object for every task
    kept = Transport(up="buffers", trainable=("a.weight", "a.bias"), kept=frozenset({"bn.running_mean"}))
    assert kept.upward(weights) == {} and list(kept.downward(weights)[0]) == ["a.weight", "a.bias", "bn.count"]


def test_a_task_missing_a_weight_that_is_not_kept_on_the_client_is_an_error():
    model = Linear().build((3,), 2)
    weights = dict(model.state_dict())
    task = ClientTask(1, 4, 0, {"1.weight": weights["1.weight"]})
    load_task_weights(model, task, Transport(kept=frozenset({"1.bias"})))  # the client's own bias: fine
    with pytest.raises(
        RuntimeError, match=r"client 4's task does not fit its model: missing \['1.bias'\], unexpected \[\]"
    ):
        load_task_weights(model, task, Transport())
