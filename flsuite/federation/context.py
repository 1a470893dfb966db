"""What a phase gets from its run (`RunContext`): the run's frozen settings, the data, the run state, and the
engine's services — client queries, server contexts, what earlier phases published, nested phases, artifacts through
the tracker, committing a step and checkpointing. A phase never assigns run state by hand."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flsuite import progress
from flsuite.data.base import FederatedData
from flsuite.federation.checkpoint import CHECKPOINT_NAME, save_checkpoint
from flsuite.federation.executors import Executor
from flsuite.federation.local.client import ClientEnvironment
from flsuite.federation.method import HyperParameters, Method
from flsuite.federation.query import ClientQuery, QueryOutcome, ask
from flsuite.federation.sampling import ClientSampling
from flsuite.federation.server import RoundServer, ServerStep
from flsuite.federation.state import FederationState, QueryAnswer, QueryTotals
from flsuite.federation.task import ClientResult, LocalTraining, Weights
from flsuite.federation.weights import digest
from flsuite.models.heads import ModelSpec
from flsuite.records import PHASE
from flsuite.seeding import Seeds, derive_seed

if TYPE_CHECKING:
    from flsuite.federation.phases import Phase
    from flsuite.tracking import Tracker


@dataclass(frozen=True)
class RunSettings:
    """The run's settings that phases read (see `Federation` for each); frozen: a phase cannot change its run.
    `seed` is the training seed (every stream a phase draws); `data_seed` is for data a phase builds (server-held
    data and its subsets)."""

    seed: int
    data_seed: int
    rounds: int
    model: ModelSpec
    method: Method
    local: LocalTraining
    sampling: ClientSampling
    server_steps: tuple[ServerStep, ...]
    on_client_failure: str
    checkpoint_every: int
    eval_every: int
    eval_device: str
    progress: bool
    name: str

    @property
    def seeds(self) -> Seeds:
        return Seeds(self.data_seed, self.seed)


@dataclass
class RunContext:
    """A run as its phases see it (see the module docstring)."""

    settings: RunSettings
    data: FederatedData
    state: FederationState
    executor: Executor
    tracker: Tracker

    @property
    def run_dir(self) -> Path:
        return self.tracker.run_dir

    # ---- clients ---------------------------------------------------------------------------------------------
    def use(self, model: ModelSpec, method: Method) -> None:
        """Make the executor's clients work with `model` and a read-only snapshot of `method`."""
        s = self.settings
        self.executor.set_env(ClientEnvironment(self.data, model, HyperParameters(method), s.local, s.seed))

    def query(
        self,
        query: ClientQuery,
        clients: Sequence[int] | None = None,
        broadcast: dict[str, Any] | None = None,
        weights: Weights | None = None,
    ) -> QueryOutcome:
        """Ask `clients` (all by default) to run `query` through the executor; seeds derive from (seed, client, query).
        The bytes each way are added to `state.queries[query.name]` (checkpointed; `query/...` in the summary).
        `weights` are counted once per client: a client keeps the model weights a query last sent it, so a later query
        with the same weights (equal content, `weights.digest`) costs it nothing down for them (the simulated client
        still gets them: it keeps nothing between calls); which digest each client holds is in `state.query_weights`
        (checkpointed). A bar over the asked clients shows the exchange; the executor answers all of them in one call,
        so it moves when they have answered."""
        seed, state = self.settings.seed, self.state
        clients = list(range(len(self.data.clients)) if clients is None else clients)
        key = digest(weights) if weights is not None else None
        charged = [k for k in clients if key is None or state.query_weights.get(k) != key]

        def seed_of(k: int) -> int:
            return derive_seed(seed, client=k, purpose=f"query/{query.name}")

        with progress.bar(len(clients), f"query {query.name}", "client", show=self.settings.progress) as bar:
            outcome = ask(self.executor.query, query, clients, seed_of, broadcast, weights, charged)
            bar.update(len(clients))
        if key is not None:
            state.query_weights.update(dict.fromkeys(clients, key))
        state.queries.setdefault(query.name, QueryTotals()).add(outcome.bytes_up, outcome.bytes_down)
        return outcome

    def query_once(
        self, owner: str, key: str, query: ClientQuery, reduce: Callable[[QueryOutcome], Any], **kwargs: Any
    ) -> QueryAnswer:
        """`query` asked once per run: `reduce(outcome)`, its seconds and bytes are kept in `state.answers[owner][key]`
        and checkpointed, so a resumed run neither asks again nor counts twice; an exchange interrupted before it was
        reduced is not counted."""
        state = self.state
        kept = state.answers.get(owner, {})
        if key not in kept:
            before = copy.deepcopy((state.queries, state.query_weights))
            t0 = time.perf_counter()
            try:
                outcome = self.query(query, **kwargs)
                value = reduce(outcome)
            except BaseException:
                state.queries, state.query_weights = before
                raise
            kept[key] = QueryAnswer(value, time.perf_counter() - t0, outcome.bytes_up, outcome.bytes_down)
            state.answers[owner] = kept
            self.checkpoint()
        return kept[key]

    # ---- the server ------------------------------------------------------------------------------------------
    def server_context(
        self,
        round: int,
        results: Sequence[ClientResult] = (),
        model: ModelSpec | None = None,
        num_clients: int | None = None,
        start_weights: Weights | None = None,
    ) -> RoundServer:
        """The server's context in `round`: its random stream, the round's results and starting weights, `model` (the
        run's by default)."""
        spec, data = model or self.settings.model, self.data
        return RoundServer(
            round,
            self.settings.seed,
            results,
            len(data.clients) if num_clients is None else num_clients,
            lambda: spec.build(data.input_shape, data.num_classes),
            self.settings.local.accelerator,
            start_weights,
            self.state.local_loop.requested if self.state.local_loop is not None else "auto",
        )

    # ---- phases ----------------------------------------------------------------------------------------------
    def publish(self, name: str, value: dict[str, Any]) -> None:
        """Store what phase `name` produced (checkpointed with the run; read back with `outputs(name)`)."""
        self.state.outputs[name] = value

    def outputs(self, name: str) -> dict[str, Any]:
        """What phase `name` published (KeyError naming the phase when it has not)."""
        if name not in self.state.outputs:
            raise KeyError(f"phase {name!r} has published nothing (yet): the phases run in protocol order")
        return self.state.outputs[name]

    def records(self, phase: str) -> list[dict[str, Any]]:
        """The committed records of phase `phase`."""
        return [r for r in self.state.history if r.get(PHASE) == phase]

    def timings(self, phase: str) -> list[dict[str, Any]]:
        return [t for t in self.state.timings if t.get(PHASE) == phase]

    def run_nested(self, phase: Phase, inside: str) -> None:
        """Run `phase` inside the phase `inside` (FKPL's experts, its federated head) unless it has published its
        outputs: a fresh start (`FederationState.restart_phase`) unless it is the one a resumed run was inside, which
        `state.nested[inside]` records; checkpointed when it has finished."""
        if phase.name in self.state.outputs:
            return
        if self.state.nested.get(inside) != phase.name:
            self.state.restart_phase()
            self.state.nested[inside] = phase.name
        phase.run(self)
        self.checkpoint()

    # ---- the run folder --------------------------------------------------------------------------------------
    def artifact(self, name: str) -> Path:
        """Where a phase writes a file of its own into the run folder (through the tracker)."""
        return self.tracker.artifact(name)

    def commit(self, record: dict[str, Any], timing: dict[str, Any], checkpoint: bool) -> None:
        """Append a finished step's record to the history and the run folder, and checkpoint if asked."""
        self.state.history.append(record)
        self.state.timings.append(timing)
        self.tracker.log_round(record, timing)
        if checkpoint:
            self.checkpoint()

    def checkpoint(self) -> None:
        save_checkpoint(self.state, self.run_dir / "checkpoints" / CHECKPOINT_NAME)
