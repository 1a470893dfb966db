"""The contract between the engine and every FL method: its two halves and the clients' view of it.

- `Method` is the server side: it initialises server and client state, says what is broadcast with the global
  weights, aggregates client results, and may train on the server after aggregation.
- `ClientModule` is the client side: hooks called by the local loops (`flsuite.federation.local`) in one client's
  fit. Methods change local training by overriding `local_loss` and the step hooks, and report back through
  `upload` and `next_state`.
- `HyperParameters`: what clients get of a method, read-only: its client module, its client settings (a frozen
  dataclass each method declares, `Method.client_settings`: what `ClientModule.method` is, type-checked) and its
  `Transport`.

The round loop (`flsuite.federation.phases.Rounds`) calls only these hooks, so it holds no method-specific code.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.task import (
    ClientResult,
    ClientTask,
    LocalTraining,
    ServerUpdate,
    State,
    Weights,
)
from flsuite.federation.transport import Transport, Travel
from flsuite.federation.weights import num_bytes, weighted_average

if TYPE_CHECKING:
    from flsuite.federation.server_context import ServerContext


@dataclass(frozen=True)
class NoSettings:
    """The client settings of a method whose clients read none (FedAvg's, FedNova's)."""


#: A method's client settings: the frozen dataclass its `ClientModule` reads as `self.method`.
S = TypeVar("S")


#: What `ClientModule.local_loss` returns: the batch loss, or (loss, statistics): tensors of the batch that the
#: method accumulates over the fit (representations and labels for class prototypes, labels for counts), which the
#: loops hand to `ClientModule.gather` outside the differentiated loss.
LocalLoss = torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]


class ClientModule(nn.Module, Generic[S]):
    """One client's local training in one round, as hooks: the method's client side. `self.method` is the method's
    client settings (`Method.client_settings`, a frozen dataclass: `ClientModule[ScaffoldClientSettings]` reads
    `self.method.effective_steps`, checked by mypy).

    The loops that call them (`local.loop`: lean, standard, compiled; `flsuite.federation.local.loops`) run one
    Lightning `Trainer.fit` per client. Per fit: `begin`, `probe` (first batch), then per batch `local_loss (→ gather) →
    backward → + gradient_offset → before_optimizer_step → optimiser step → after_optimizer_step`, then `end`; the
    engine's result carries `upload`, `next_state` and `metrics` (`flsuite.federation.local.client.client_result`). The
    loop counts the fit's losses and steps (`FitStatistics`) and hands them to the hooks that run after it. `device`,
    `epoch` and `epochs` are set by the loop (the fit's device, the epoch running, how many).
    """

    #: The statistic by which a method whose objective adds terms to the FL task's loss (a proximal term, a
    #: regulariser) reports that loss (cross-entropy on the batch): the loops average it into `ClientResult.task_loss`
    #: (what e.g. FedEGG's gate reads as L^c) and do not pass it to `gather`.
    TASK_LOSS: ClassVar[str] = "task_loss"

    #: Whether `before_optimizer_step` / `after_optimizer_step` do anything: a subclass that overrides either must
    #: say so (the compiled loop then calls them between the steps instead of scanning runs of batches).
    step_hooks: ClassVar[bool] = False

    #: Whether `local.loop: auto` may choose the compiled loop for this client (then only where it pays): False for a
    #: loss that compiles to slower steps than the lean loop's, e.g. FedFA's, whose per-step Gaussian draws inductor
    #: generates element by element. `local.loop: compiled` still compiles it.
    compiled_pays: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overridden = [
            n
            for n in ("before_optimizer_step", "after_optimizer_step")
            if getattr(cls, n) is not getattr(ClientModule, n)
        ]
        if overridden and not cls.step_hooks:
            raise TypeError(
                f"{cls.__name__} overrides {' and '.join(overridden)}: declare `step_hooks = True` on the class"
            )

    def __init__(self, model: nn.Module, method: S, local: LocalTraining, task: ClientTask) -> None:
        super().__init__()
        self.model = model
        self.method: S = method
        self.local = local
        self.task = task
        self.device = next(model.parameters(), torch.empty(0)).device
        self.epoch, self.epochs = 0, 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # ---- hooks for methods -----------------------------------------------------------------------------------
    def begin(self) -> None:
        """Called when the fit starts, on its device (e.g. move the broadcast's tensors there)."""

    def end(self, fit: FitStatistics) -> None:
        """Called when the fit has finished its last step, with the fit's statistics (e.g. its step count)."""

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> LocalLoss:
        """The local objective on one batch; FedAvg: cross-entropy. A method that accumulates statistics of its
        batches returns (loss, statistics) and accumulates them in `gather`, never in place here: the loss must be a
        pure function of the parameters, the batch and state fixed for the fit (what `local.loop: compiled`
        differentiates and compiles)."""
        return F.cross_entropy(self.model(x), y)

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        """Accumulate one step's statistics, as `local_loss` returned them but detached. Called once per step, in
        step order, with no gradient recorded (under `local.loop: compiled`, after the compiled call that ran the
        steps). Default: nothing."""

    def gradient_offset(self) -> dict[str, torch.Tensor]:
        """A constant added to the gradient of each named parameter of `self.model` after every backward, before
        `before_optimizer_step` (e.g. SCAFFOLD's correction c − c_k); empty (the default): none. Read at the start of
        every epoch, so it must stay fixed for the fit. Unlike a hook, `local.loop: compiled` folds it into the
        steps it compiles together."""
        return {}

    def before_optimizer_step(self) -> None:
        """Called after backward (and `gradient_offset`), before the optimiser step (e.g. gradient clipping);
        overriding it needs `step_hooks = True`."""

    def after_optimizer_step(self) -> None:
        """Called after each optimiser step; overriding it needs `step_hooks = True`."""

    def probe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """A measurement too costly for every step (e.g. per-term gradient norms), called once per fit by every loop
        on the fit's first batch before its first step, at the fit's starting weights. The loop isolates it
        (`flsuite.federation.local.steps.probe`): torch's RNG is forked, autocast is off and the model's buffers are
        restored, so the training is the same to the bit; the hook itself must leave `.grad` alone (use
        `torch.autograd.grad`). Report its result through `metrics`. Default: nothing (the loops do not call it)."""

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        """Numbers describing this fit (e.g. the mean of each loss term), logged per round as the sample-weighted
        mean over the round's clients under `client/<method>/<key>` (`records.client_metric_key`). Default: none."""
        return {}

    def upload(self, fit: FitStatistics) -> dict[str, Any]:
        """Extras sent to the server besides the weights (e.g. prototypes, control-variate deltas)."""
        return {}

    def next_state(self, fit: FitStatistics) -> State:
        """This client's state for its next round; by default unchanged."""
        return self.task.state


class Method:
    """Server side of an FL method. The defaults are FedAvg's: nothing extra is sent or kept, and weights are
    averaged ∝ client sample count.

    Subclasses set `client_module` to their `ClientModule` subclass and override the hooks they need. Hooks receive
    state and return new state: the loop commits a round only when it has completed. Clients never see the live
    server object: they get `HyperParameters`, taken when a phase starts, whose settings are `client_settings()`.
    A multi-stage method that runs its own protocol also defines `protocol()` (`flsuite.federation.phases.OwnProtocol`).
    """

    client_module: ClassVar[type[ClientModule]] = ClientModule
    #: Which weights travel each way besides the upload and broadcast (`Transport`: the engine carries exactly these
    #: and `bytes_up`/`bytes_down` count them): "all" (the state dict), "trainable" (the parameters of
    #: `parameter_names` only: FKPL's federated head), "buffers" (the floating-point entries that are not trainable
    #: parameters, e.g. BatchNorm statistics: SCAFFOLD, whose upload carries Δy in place of the parameters).
    weights_up: ClassVar[Travel] = "all"
    weights_down: ClassVar[Travel] = "all"
    #: Set by `setup`: the number of clients this method trains over, and which state-dict entries are trainable
    #: parameters (the others are buffers, e.g. BatchNorm statistics).
    num_clients: int = 0
    parameter_names: tuple[str, ...] = ()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        """Called once per phase that runs this method (and on resume), before any other hook of that phase."""
        self.num_clients = num_clients
        self.parameter_names = tuple(n for n, p in model.named_parameters() if p.requires_grad)

    def client_settings(self) -> object:
        """The hyperparameters this method's clients read, as a frozen dataclass instance (what `ClientModule.method`
        is; e.g. SCAFFOLD's `ScaffoldClientSettings(effective_steps)`). Default: `NoSettings()`."""
        return NoSettings()

    def init_server_state(self, global_weights: Weights) -> State:
        """Server-side state kept across rounds (checkpointed)."""
        return {}

    def init_client_state(self, client_id: int, global_weights: Weights) -> State:
        """A client's state before its first round (checkpointed)."""
        return {}

    def broadcast(self, round: int, server_state: State) -> dict[str, Any]:
        """Extras sent to every sampled client along with the global weights."""
        return {}

    def broadcast_to(self, round: int, client_id: int, server_state: State, shared: dict[str, Any]) -> dict[str, Any]:
        """What client `client_id` receives besides the global weights; by default the round's shared `broadcast`
        (return `shared` itself when nothing is client-specific: executors then send it once)."""
        return shared

    def aggregation_coefficients(self, results: Sequence[ClientResult]) -> list[float]:
        """Weights of the clients in the average: their sample counts."""
        return [float(r.num_samples) for r in results]

    def aggregate(
        self,
        round: int,
        global_weights: Weights,
        results: Sequence[ClientResult],
        server_state: State,
        ctx: ServerContext | None = None,
    ) -> tuple[Weights, State]:
        """New global weights and server state from this round's client results. `ctx` (given by the loop) offers
        the server's derived random stream, server-side fits and the round's context (see `ServerContext`)."""
        return weighted_average([r.weights for r in results], self.aggregation_coefficients(results)), server_state

    def server_update(self, ctx: ServerContext, weights: Weights, server_state: State) -> ServerUpdate:
        """Optional server-side training after aggregation: returns the new weights, state and metrics to log."""
        return ServerUpdate(weights, server_state)

    # ---- what travels ----------------------------------------------------------------------------------------
    def kept_on_client(self) -> frozenset[str]:
        """State-dict entries that never leave a client, neither way (e.g. FedSR's per-client reference Gaussians, a
        FedBN's BatchNorm layers): a task does not carry them, a result does not return them, and the global weights
        keep the server's own copy (what `aggregate` returns for them). Default: none."""
        return frozenset()

    def transport(self) -> Transport:
        """What travels each way (`weights_up`, `weights_down`, `kept_on_client`, over `parameter_names`): set up
        after `setup`, read by the engine to build the tasks and results."""
        return Transport(self.weights_up, self.weights_down, self.parameter_names, self.kept_on_client())

    def travelling(self, weights: Weights, which: Travel) -> Weights:
        """The entries of `weights` that travel under `which` (see `Transport.travelling`)."""
        return self.transport().travelling(weights, which)

    def bytes_down(self, task: ClientTask) -> int:
        """Bytes the server sends to one client in a round: the global weights its task carries and its broadcast."""
        return num_bytes(task.global_weights) + num_bytes(task.broadcast)

    def bytes_up(self, result: ClientResult) -> int:
        """Bytes one client sends back: the weights its result carries and its upload."""
        return num_bytes(result.weights) + num_bytes(result.upload)


class HyperParameters:
    """What clients get of a method, read-only, taken when its phase starts (`RunContext.use`): `client_module`,
    `settings` (a deep copy of `Method.client_settings()`, so serial and Ray clients see the same values whatever the
    server later does to its own object) and `transport` (`Method.transport()`)."""

    client_module: type[ClientModule]
    settings: object
    transport: Transport

    def __init__(self, method: Method) -> None:
        settings = method.client_settings()
        if not (
            dataclasses.is_dataclass(settings)
            and not isinstance(settings, type)
            and type(settings).__dataclass_params__.frozen  # type: ignore[attr-defined]
        ):
            raise TypeError(
                f"{type(method).__name__}.client_settings() must return a frozen dataclass instance, "
                f"got {type(settings).__name__}"
            )
        object.__setattr__(self, "client_module", method.client_module)
        object.__setattr__(self, "settings", copy.deepcopy(settings))
        object.__setattr__(self, "transport", method.transport())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"clients see the method's hyperparameters read-only (tried to set {name!r}); "
            "send per-round values through broadcast"
        )
