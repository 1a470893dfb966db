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
the services of its `RunContext` (`flsuite.federation.context`): `query` for client computations through the
executor, `publish`/`outputs` for what phases produce, `commit` for its records.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from flsuite import progress, records
from flsuite.federation.client_states import ClientStates
from flsuite.federation.server import ServerStep, run_server_steps
from flsuite.federation.state import FederationState
from flsuite.federation.task import (
    ClientFailure,
    ClientResult,
    ClientTask,
    State,
    Weights,
)
from flsuite.federation.weights import clone_weights, is_finite
from flsuite.metrics import evaluate_federation
from flsuite.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext
    from flsuite.federation.method import Method
    from flsuite.models.heads import ModelSpec

log = logging.getLogger(__name__)


class ClientFailedError(RuntimeError):
    """A round could not proceed: a client failed under the "fail" policy, or no client update was usable."""


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


@runtime_checkable
class OwnProtocol(Protocol):
    """A method that runs its own protocol when the config gives no `protocol:` (FKPL: cluster, train experts,
    calibrate; FedMix): `protocol()` returns its phases, or None for rounds of it over every client. Declared here,
    beside `Phase`, not on `Method`: the method contract (`flsuite.federation.method`) stays below the phases."""

    def protocol(self) -> list[Phase] | None: ...


def own_protocol(method: Method) -> list[Phase] | None:
    """`method`'s own protocol (`OwnProtocol`), or None (`Federation` then runs `[Rounds()]`)."""
    return method.protocol() if isinstance(method, OwnProtocol) else None


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
        settings, data, state = ctx.settings, ctx.data, ctx.state
        rounds = self.rounds or settings.rounds
        model_spec, method = self.model or settings.model, self.method or settings.method
        steps = list(settings.server_steps if self.server_steps is None else self.server_steps)
        clients = list(range(len(data.clients))) if self.clients is None else list(self.clients)
        if max(clients) >= len(data.clients) or min(clients) < 0:
            raise ValueError(
                f"phase {self.name!r}: clients {clients} but the federation has clients 0..{len(data.clients) - 1}"
            )
        seed_torch(derive_seed(settings.seed, purpose="model_init"))  # a phase starts like a run of its own
        model = model_spec.build(data.input_shape, data.num_classes)
        method.setup(model, len(clients))
        ctx.use(model_spec, method)
        for step in steps:
            step.prepare(ctx)
        if not state.global_weights:  # a fresh phase
            weights = clone_weights(model.state_dict())
            state.global_weights, state.server_state = weights, method.init_server_state(weights)
            state.initial_weights = weights
            state.client_states = ClientStates(clients)
            state.step_states = [s.init_state(weights, ctx) for s in steps]
        initial = (
            state.initial_weights
        )  # a client first sampled (also after a resume) starts from init_client_state(k, W₀)
        state.client_states.initial = lambda k: method.init_client_state(k, initial)
        global_model = model_spec.build(data.input_shape, data.num_classes)
        global_model.load_state_dict(state.global_weights)
        desc = settings.name if not self.prefix else f"{settings.name} {self.name}"
        with progress.bar(rounds, desc, "round", initial=state.round, show=settings.progress) as bar:
            for rnd in range(state.round + 1, rounds + 1):
                done = self._round(ctx, rnd, rounds, clients, method, steps, global_model)
                state.round, state.global_weights, state.server_state = rnd, done.weights, done.server_state
                state.client_states.update(done.client_states)
                state.step_states = done.step_states
                ctx.commit(done.record, done.timing, checkpoint=rnd % settings.checkpoint_every == 0 or rnd == rounds)
                if f"{self.prefix}acc_mean" in done.record:
                    bar.set_postfix(acc_mean=f"{done.record[f'{self.prefix}acc_mean']:.2f}")
                bar.update(1)
        ctx.publish(self.name, {"weights": state.global_weights})

    def _round(
        self,
        ctx: RunContext,
        rnd: int,
        rounds: int,
        clients: list[int],
        method: Method,
        steps: Sequence[ServerStep],
        global_model: torch.nn.Module,
    ) -> _Round:
        settings, data, state = ctx.settings, ctx.data, ctx.state
        t0 = time.perf_counter()
        sampled = [clients[i] for i in settings.sampling.sample(len(clients), settings.seed, rnd)]
        shared = method.broadcast(rnd, state.server_state)
        carried, held = method.transport().downward(state.global_weights)  # once: executors send each object once
        tasks = [
            ClientTask(
                rnd,
                k,
                derive_seed(settings.seed, rnd, k, "client"),
                carried,
                method.broadcast_to(rnd, k, state.server_state, shared),
                state.client_states[k],
                held,
            )
            for k in sampled
        ]
        outcomes = ctx.executor.run(tasks)
        t_clients = time.perf_counter() - t0
        results, failed, rejected = _usable(rnd, outcomes, settings.on_client_failure)

        server = ctx.server_context(
            rnd, results, self.model, num_clients=len(clients), start_weights=state.global_weights
        )
        weights, server_state = method.aggregate(rnd, state.global_weights, results, state.server_state, ctx=server)
        update = method.server_update(server, weights, server_state)
        weights, step_states, step_metrics = run_server_steps(steps, server, update.weights, state.step_states)
        global_model.load_state_dict(weights)

        n_total = sum(r.num_samples for r in results)
        metrics: dict[str, Any] = {
            records.CLIENTS: sampled,
            records.CLIENTS_FAILED: [f.client_id for f in failed],
            records.CLIENTS_REJECTED: rejected,
            records.TRAIN_LOSS: sum(r.train_loss * r.num_samples for r in results) / n_total,
            **records.traffic(
                up=sum(method.bytes_up(r) for r in results), down=sum(method.bytes_down(t) for t in tasks)
            ),
            records.CLIENT_LOSS: {str(r.client_id): r.train_loss for r in results},
            records.CLIENT_STEPS: {str(r.client_id): r.num_steps for r in results},
            **client_metrics(type(method).__name__, results),
            **{f"{records.SERVER_PREFIX}{k}": v for k, v in {**update.metrics, **step_metrics}.items()},
        }
        t_eval = time.perf_counter()
        if rnd % settings.eval_every == 0 or rnd == rounds:
            metrics.update(
                evaluate_federation(global_model, data, device=settings.eval_device)
            )  # + val/ with validation data
        now = time.perf_counter()
        seconds = {
            records.ROUND_SECONDS: now - t0,
            records.CLIENTS_SECONDS: t_clients,
            records.EVAL_SECONDS: now - t_eval,
        }
        phase = self.name if self.prefix else None  # the default protocol's rounds: plain names, no phase
        record = records.record(rnd, metrics, phase=phase, prefix=self.prefix)
        timing = records.record(rnd, seconds, phase=phase, prefix=self.prefix)
        return _Round(
            record,
            timing,
            clone_weights(global_model.state_dict()),
            update.state,
            {r.client_id: r.state for r in results},
            step_states,
        )

    def summary_records(self, history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.prefix:
            return [r for r in history if records.PHASE not in r]
        return [records.without_prefix(r, self.prefix) for r in history if r.get(records.PHASE) == self.name]


def client_metrics(method: str, results: Sequence[ClientResult]) -> dict[str, float]:
    """Each key of the clients' `ClientResult.metrics` (in the order first reported) under
    `records.client_metric_key`: Σ_k n_k m_k / Σ_k n_k over the clients k that report it; none reported: {}."""
    keys = dict.fromkeys(k for r in results for k in r.metrics)
    out = {}
    for key in keys:
        having = [r for r in results if key in r.metrics]
        out[records.client_metric_key(method, key)] = sum(r.metrics[key] * r.num_samples for r in having) / sum(
            r.num_samples for r in having
        )
    return out


def _usable(
    rnd: int, outcomes: Sequence[ClientResult | ClientFailure], policy: str
) -> tuple[list[ClientResult], list[ClientFailure], list[int]]:
    """The round's usable results, its failed clients and the clients whose non-finite updates were rejected."""
    failed = [o for o in outcomes if isinstance(o, ClientFailure)]
    if failed and policy == "fail":
        raise ClientFailedError(
            f"round {rnd}: client(s) {[f.client_id for f in failed]} failed after {failed[0].attempts} attempt(s): "
            f"{failed[0].error} (set on_client_failure: drop to continue without them)"
        )
    finite = {
        id(o): o.finite and is_finite(o.weights) for o in outcomes if isinstance(o, ClientResult)
    }  # the whole model, then what came
    results = [o for o in outcomes if isinstance(o, ClientResult) and finite[id(o)]]
    rejected = [o.client_id for o in outcomes if isinstance(o, ClientResult) and not finite[id(o)]]
    if rejected:
        log.warning("round %d: rejected non-finite updates from client(s) %s", rnd, rejected)
    if not results:
        raise ClientFailedError(
            f"round {rnd}: no usable client update (failed {[f.client_id for f in failed]}, non-finite {rejected})"
        )
    return results, failed, rejected
