"""Client queries: one-shot computations on clients, run by the round loop's executor (serial or Ray).

A query is what a protocol asks of every (or some) client outside local training: GGEUR's per-class statistics, FKPL's
subspace bases, prototypes and virtual features, FedEGG's τ_k. The server sends a `QueryTask` (the query object, what
it broadcasts, optionally model weights) and gets back a `QueryResult` whose `upload` is everything that left the
client; `bytes_up` is counted from that payload (`num_bytes`), so what leaves a client is explicit in one place.

A query object must be picklable (it travels to Ray workers) and deterministic given its task's seed.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from flsuite.federation.task import ClientFailure, Weights
from flsuite.federation.weights import num_bytes
from flsuite.seeding import seed_torch

if TYPE_CHECKING:
    from flsuite.data.base import ClientData, FederatedData


class ClientQuery(abc.ABC):
    """What a client computes on its own data for a one-shot exchange."""

    #: A short name used in byte metrics and derived seeds (e.g. "ggeur/class_stats").
    name: str = "query"

    @abc.abstractmethod
    def compute(self, client: ClientData, task: QueryTask, model: torch.nn.Module | None) -> dict[str, Any]:
        """The client's upload (tensors and plain values). `model` is built and loaded when the task has weights."""


@dataclass
class QueryTask:
    """One client's query order: the query, what the server broadcasts with it, optional model weights."""

    client_id: int
    seed: int
    query: ClientQuery
    broadcast: dict[str, Any] = field(default_factory=dict)
    weights: Weights | None = None
    #: The executor's retry bookkeeping uses `round`; queries are outside rounds.
    round: int = 0


@dataclass
class QueryResult:
    """A client's answer to a query: exactly what it uploads."""

    client_id: int
    upload: dict[str, Any]

    @property
    def bytes_up(self) -> int:
        return num_bytes(self.upload)


class QueryEnvironment(Protocol):
    """What answering a query needs of the run's clients: their data and the run's model (an executor's
    `flsuite.federation.local.client.ClientEnvironment` is one)."""

    @property
    def data(self) -> FederatedData: ...

    def build_model(self) -> nn.Module: ...


def run_query(env: QueryEnvironment, task: QueryTask) -> QueryResult:
    """Compute one client's answer (executors call this, in-process or on a worker)."""
    model = None
    if task.weights is not None:
        seed_torch(task.seed)
        model = env.build_model()
        model.load_state_dict(task.weights)
    with torch.no_grad():
        upload = task.query.compute(env.data.clients[task.client_id], task, model)
    return QueryResult(task.client_id, upload)


def in_process(data: FederatedData) -> QueryRunner:
    """Answers model-free client queries in this process (a setup stage used outside a run, e.g. in tests)."""

    def answer(tasks: Sequence[QueryTask]) -> list[QueryResult | ClientFailure]:
        if any(t.weights is not None for t in tasks):
            raise ValueError("in-process client queries cannot carry model weights; run them through an executor")
        with torch.no_grad():
            return [QueryResult(t.client_id, t.query.compute(data.clients[t.client_id], t, None)) for t in tasks]

    return answer


@dataclass
class QueryOutcome:
    """The answers of one query over the asked clients, and what it communicated (bytes, totals over clients)."""

    results: list[QueryResult]
    bytes_up: int
    bytes_down: int

    def uploads(self) -> dict[int, dict[str, Any]]:
        return {r.client_id: r.upload for r in self.results}


#: Runs a list of query tasks and returns results (or failures) in task order: an executor's `query`.
QueryRunner = Callable[[Sequence[QueryTask]], "list[QueryResult | ClientFailure]"]


def ask(
    runner: QueryRunner,
    query: ClientQuery,
    clients: Sequence[int],
    seed_of: Callable[[int], int],
    broadcast: dict[str, Any] | None = None,
    weights: Weights | None = None,
    charged: Sequence[int] | None = None,
) -> QueryOutcome:
    """Send `query` to `clients`, collect every answer, count the bytes each way: the broadcast to every client,
    `weights` to the `charged` clients only (null: all; the others already hold them, see `RunContext.query`).

    Raises when a client fails: a one-shot exchange has no "drop" policy (its result shapes the whole run).
    """
    broadcast = broadcast or {}
    tasks = [QueryTask(k, seed_of(k), query, broadcast, weights) for k in clients]
    outcomes = runner(tasks)
    failed = [o for o in outcomes if isinstance(o, ClientFailure)]
    if failed:
        raise RuntimeError(f"query {query.name!r}: client(s) {[f.client_id for f in failed]} failed: {failed[0].error}")
    results = [o for o in outcomes if isinstance(o, QueryResult)]
    payers = len(tasks) if charged is None else len(set(charged) & set(clients))
    down = len(tasks) * num_bytes(broadcast) + (payers * num_bytes(weights) if weights is not None else 0)
    return QueryOutcome(results, sum(r.bytes_up for r in results), down)
