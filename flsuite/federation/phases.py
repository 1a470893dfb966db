"""Protocols of phases. A run (`Federation.fit`) owns the folder, tracker, executor and checkpoints; its protocol is
an ordered list of phases that it runs one after another, resuming a killed run inside the phase it was in.

`Rounds` is the round loop — the only one in the suite:

    sample clients → each client's task (the phase's global weights + the method's broadcast, per client if the method
    says so + that client's state) → the executor runs every client's Lightning fit → the method aggregates (with a
    `ServerContext`) → the method's server update → the federation's server steps → evaluate the global model per
    domain → commit the round (state, history, run folder) → checkpoint.

Nothing of round r is committed before all of it has finished: an interrupt anywhere inside the round (a client fit,
aggregation, a server step, evaluation) leaves the state of round r − 1, and the resumed run recomputes round r
exactly (every random stream is derived from (seed, round, client, purpose)).

A phase other than rounds (a one-shot client query, a server fit, a clustering step) is a `Phase` subclass that uses
the `RunContext`: `query` for client computations through the executor, `state.outputs` for what it produces.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from flsuite import progress
from flsuite.data.base import FederatedData
from flsuite.federation.checkpoint import CHECKPOINT_NAME, FederationState, save_checkpoint
from flsuite.federation.client import ClientEnvironment
from flsuite.federation.executors import ClientFailure
from flsuite.federation.query import ClientQuery, QueryOutcome, ask
from flsuite.federation.server import ServerContext, ServerStep, run_server_steps
from flsuite.federation.task import ClientResult, ClientTask, State, Weights
from flsuite.federation.weights import clone_weights, is_finite
from flsuite.methods.base import HyperParameters, Method
from flsuite.metrics import evaluate
from flsuite.models.heads import ModelSpec
from flsuite.seeding import derive_seed

if TYPE_CHECKING:
    from flsuite.federation.loop import Federation
    from flsuite.tracking import Tracker

log = logging.getLogger(__name__)


class ClientFailedError(RuntimeError):
    """A round could not proceed: a client failed under the "fail" policy, or no client update was usable."""


@dataclass
class RunContext:
    """What a phase gets from its run: the federation's settings, the data, the run state, the executor, the tracker."""

    federation: Federation
    data: FederatedData
    state: FederationState
    tracker: Tracker
    run_dir: Any

    def use(self, model: ModelSpec, method: Method) -> None:
        """Make the executor's clients work with `model` and a read-only snapshot of `method`."""
        fed = self.federation
        fed.executor.set_env(ClientEnvironment(self.data, model, HyperParameters(method), fed.local, fed.seed))  # type: ignore[arg-type]

    def query(self, query: ClientQuery, clients: Sequence[int] | None = None, broadcast: dict[str, Any] | None = None, weights: Weights | None = None) -> QueryOutcome:
        """Ask `clients` (all by default) to run `query` through the executor; seeds derive from (seed, client, query).
        The bytes each way are added to `state.outputs["queries"][query.name]` (checkpointed; `query/...` in the summary).
        A bar over the asked clients shows the exchange; the executor answers all of them in one call, so it moves
        when they have answered."""
        seed = self.federation.seed
        clients = list(range(len(self.data.clients)) if clients is None else clients)
        with progress.bar(len(clients), f"query {query.name}", "client", show=self.federation.progress) as bar:
            outcome = ask(self.federation.executor.query, query, clients, lambda k: derive_seed(seed, client=k, purpose=f"query/{query.name}"), broadcast, weights)
            bar.update(len(clients))
        totals = self.state.outputs.setdefault("queries", {}).setdefault(query.name, {"calls": 0, "bytes_up": 0, "bytes_down": 0})
        totals["calls"] += 1
        totals["bytes_up"] += outcome.bytes_up
        totals["bytes_down"] += outcome.bytes_down
        return outcome

    def commit(self, record: dict[str, Any], timing: dict[str, Any], checkpoint: bool) -> None:
        """Append a finished step's record to the history and the run folder, and checkpoint if asked."""
        self.state.history.append(record)
        self.state.timings.append(timing)
        self.tracker.log_round(record, timing)
        if checkpoint:
            self.checkpoint()

    def checkpoint(self) -> None:
        save_checkpoint(self.state, self.run_dir / "checkpoints" / CHECKPOINT_NAME)


class Phase(abc.ABC):
    """One step of a protocol. `run` continues from `ctx.state` (which may come from a checkpoint of this phase)."""

    name: str = "phase"

    @abc.abstractmethod
    def run(self, ctx: RunContext) -> None: ...

    def summary_records(self, history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """This phase's evaluated records, under the un-prefixed metric names (for the final summary)."""
        return []

    def summary_extras(self, state: FederationState) -> dict[str, Any]:
        """Numbers this phase adds to the final summary (e.g. its communication and time per stage)."""
        return {}


@dataclass
class _Round:
    """Everything one round produced, committed only when the round is complete."""

    record: dict[str, Any]
    timing: dict[str, Any]
    weights: Weights
    server_state: State
    client_states: dict[int, State]
    step_states: list[State]


class Rounds(Phase):
    """Rounds of a method over all or some clients, with its own model and metric prefix.

    Args:
        name: The phase's name (checkpoints, `outputs`, the `phase` key of its records when prefixed).
        rounds: Communication rounds; null = the federation's `rounds`.
        clients: The clients that take part (sampled among by `sampling`); null = all.
        model: The model trained; null = the federation's `model`.
        method: The FL method; null = the federation's `method`.
        server_steps: Server steps after aggregation; null = the federation's `server_steps`.
        prefix: Prefix of this phase's metric names (e.g. "expert0/"); "" keeps the plain names.
    """

    def __init__(
        self,
        name: str = "train",
        rounds: int | None = None,
        clients: list[int] | None = None,
        model: ModelSpec | None = None,
        method: Method | None = None,
        server_steps: list[ServerStep] | None = None,
        prefix: str = "",
    ) -> None:
        if rounds is not None and rounds < 1:
            raise ValueError(f"phase {name!r}: rounds must be >= 1 or null, got {rounds}")
        if clients is not None and (not clients or len(set(clients)) != len(clients)):
            raise ValueError(f"phase {name!r}: clients must be a non-empty list of distinct client ids, got {clients}")
        self.name, self.rounds, self.clients, self.model, self.method = name, rounds, clients, model, method
        self.server_steps, self.prefix = server_steps, prefix

    def run(self, ctx: RunContext) -> None:
        fed, data, state = ctx.federation, ctx.data, ctx.state
        rounds = self.rounds or fed.rounds
        model_spec, method = self.model or fed.model, self.method or fed.method
        steps = fed.server_steps if self.server_steps is None else self.server_steps
        clients = list(range(len(data.clients))) if self.clients is None else list(self.clients)
        if max(clients) >= len(data.clients) or min(clients) < 0:
            raise ValueError(f"phase {self.name!r}: clients {clients} but the federation has clients 0..{len(data.clients) - 1}")
        torch.manual_seed(derive_seed(fed.seed, purpose="model_init"))  # a phase starts like a run of its own
        model = model_spec.build(data.input_shape, data.num_classes)
        method.setup(model, len(clients))
        ctx.use(model_spec, method)
        for step in steps:
            step.prepare(ctx)
        if not state.global_weights:  # a fresh phase
            weights = clone_weights(model.state_dict())
            state.global_weights, state.server_state = weights, method.init_server_state(weights)
            state.client_states = {k: method.init_client_state(k, weights) for k in clients}
            state.step_states = [s.init_state(weights, ctx) for s in steps]
        global_model = model_spec.build(data.input_shape, data.num_classes)
        global_model.load_state_dict(state.global_weights)
        desc = fed.name if not self.prefix else f"{fed.name} {self.name}"
        with progress.bar(rounds, desc, "round", initial=state.round, show=fed.progress) as bar:
            for rnd in range(state.round + 1, rounds + 1):
                done = self._round(ctx, rnd, rounds, clients, method, steps, global_model)
                state.round, state.global_weights, state.server_state = rnd, done.weights, done.server_state
                state.client_states.update(done.client_states)
                state.step_states = done.step_states
                ctx.commit(done.record, done.timing, checkpoint=rnd % fed.checkpoint_every == 0 or rnd == rounds)
                if f"{self.prefix}acc_mean" in done.record:
                    bar.set_postfix(acc_mean=f"{done.record[f'{self.prefix}acc_mean']:.2f}")
                bar.update(1)
        state.outputs[self.name] = {"weights": state.global_weights}

    def _round(self, ctx: RunContext, rnd: int, rounds: int, clients: list[int], method: Method, steps: Sequence[ServerStep], global_model: torch.nn.Module) -> _Round:
        fed, data, state = ctx.federation, ctx.data, ctx.state
        t0 = time.perf_counter()
        sampled = [clients[i] for i in fed.sampling.sample(len(clients), fed.seed, rnd)]
        shared = method.broadcast(rnd, state.server_state)
        tasks = [
            ClientTask(rnd, k, derive_seed(fed.seed, rnd, k, "client"), state.global_weights, method.broadcast_to(rnd, k, state.server_state, shared), state.client_states[k])
            for k in sampled
        ]
        outcomes = fed.executor.run(tasks)
        t_clients = time.perf_counter() - t0
        results, failed, rejected = _usable(rnd, outcomes, fed.on_client_failure)

        model_spec = self.model or fed.model
        server = ServerContext(rnd, fed.seed, results, len(clients), lambda: model_spec.build(data.input_shape, data.num_classes), fed.local.accelerator)
        weights, server_state = method.aggregate(rnd, state.global_weights, results, state.server_state, ctx=server)
        update = method.server_update(server, weights, server_state)
        weights, step_states, step_metrics = run_server_steps(steps, server, update.weights, state.step_states)
        global_model.load_state_dict(weights)

        n_total = sum(r.num_samples for r in results)
        record: dict[str, Any] = {
            "round": rnd,
            "clients": sampled,
            "clients_failed": [f.client_id for f in failed],
            "clients_rejected": rejected,
            "train_loss": sum(r.train_loss * r.num_samples for r in results) / n_total,
            "bytes_down": sum(method.bytes_down(t) for t in tasks),
            "bytes_up": sum(method.bytes_up(r) for r in results),
            "client_loss": {str(r.client_id): r.train_loss for r in results},
            "client_steps": {str(r.client_id): r.num_steps for r in results},
            **{f"server/{k}": v for k, v in {**update.metrics, **step_metrics}.items()},
        }
        t_eval = time.perf_counter()
        if rnd % fed.eval_every == 0 or rnd == rounds:
            record.update(evaluate(global_model, data.test, data.num_classes, device=fed.eval_device))
        now = time.perf_counter()
        timing = {"round": rnd, "time/round_s": now - t0, "time/clients_s": t_clients, "time/eval_s": now - t_eval}
        if self.prefix:
            record = {"round": rnd, "phase": self.name, **{f"{self.prefix}{k}": v for k, v in record.items() if k != "round"}}
            timing = {"round": rnd, "phase": self.name, **{f"{self.prefix}{k}": v for k, v in timing.items() if k != "round"}}
        return _Round(record, timing, clone_weights(global_model.state_dict()), update.state, {r.client_id: r.state for r in results}, step_states)

    def summary_records(self, history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.prefix:
            return [r for r in history if "phase" not in r]
        n = len(self.prefix)
        return [{k[n:] if k.startswith(self.prefix) else k: v for k, v in r.items()} for r in history if r.get("phase") == self.name]


def _usable(rnd: int, outcomes: Sequence[ClientResult | ClientFailure], policy: str) -> tuple[list[ClientResult], list[ClientFailure], list[int]]:
    """The round's usable results, its failed clients and the clients whose non-finite updates were rejected."""
    failed = [o for o in outcomes if isinstance(o, ClientFailure)]
    if failed and policy == "fail":
        raise ClientFailedError(
            f"round {rnd}: client(s) {[f.client_id for f in failed]} failed after {failed[0].attempts} attempt(s): "
            f"{failed[0].error} (set on_client_failure: drop to continue without them)"
        )
    results = [o for o in outcomes if isinstance(o, ClientResult) and is_finite(o.weights)]
    rejected = [o.client_id for o in outcomes if isinstance(o, ClientResult) and not is_finite(o.weights)]
    if rejected:
        log.warning("round %d: rejected non-finite updates from client(s) %s", rnd, rejected)
    if not results:
        raise ClientFailedError(f"round {rnd}: no usable client update (failed {[f.client_id for f in failed]}, non-finite {rejected})")
    return results, failed, rejected
