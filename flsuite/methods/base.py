"""The two halves of every FL method.

- `Method` is the server side: it initialises server and client state, says what is broadcast with the global
  weights, aggregates client results, and may train on the server after aggregation.
- `ClientModule` is the client side: a `LightningModule` whose fit is one client's local training in one round.
  Methods change local training by overriding `local_loss` and the optimiser-step hooks, and report back through
  `upload` and `next_state`.

The round loop (flsuite.federation.loop) calls only these hooks, so it holds no method-specific code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.compiled import CompiledSteps
from flsuite.federation.sgd import grad_clearer, optimizer_step
from flsuite.federation.task import (
    ClientResult,
    ClientTask,
    LocalTraining,
    State,
    Weights,
)
from flsuite.federation.weights import num_bytes

if TYPE_CHECKING:
    from flsuite.federation.phases import Phase
    from flsuite.federation.server import ServerContext, ServerUpdate


def add_to_gradients(offsets: Sequence[tuple[nn.Parameter, torch.Tensor]]) -> None:
    """`p.grad += offset` for each (parameter, offset) pair whose parameter got a gradient."""
    for p, offset in offsets:
        if p.grad is not None:
            p.grad.add_(offset)


class ClientModule(L.LightningModule):
    """One client's local training in one round, run by `Trainer.fit`.

    Manual optimisation: Lightning calls `training_step` once per local epoch with that epoch's pre-sliced batches
    (see `flsuite.data.base.EpochBatches`), and the step loops over them. For each batch:
    `zero_grad → local_loss → backward → + gradient_offset → before_optimizer_step → optimizer.step →
    after_optimizer_step`.
    """

    def __init__(self, model: nn.Module, method: Method, local: LocalTraining, task: ClientTask) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model = model
        self.method = method
        self.local = local
        self.task = task
        self._loss_sum = torch.zeros((), dtype=torch.float64)
        self.num_steps = 0
        self._compiled_steps: CompiledSteps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.local.make_optimizer(self.model.parameters(), round=self.task.round)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # an epoch's list of batches; each batch is moved in training_step

    def training_step(self, epoch_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        if self.automatic_optimization:  # local.loop: standard, one batch per step
            return self.standard_training_step(epoch_batches, batch_idx)
        # The raw torch optimiser and `loss.backward()`: no per-batch Lightning wrapper work (strategy, precision
        # plugin, on_before/after_backward hooks: ~15% of a small head's step). Correct because client Trainers run
        # on one device in 32-bit precision (make_trainer); a 16-mixed precision plugin would need its GradScaler here.
        # Nor torch.optim's own wrapper where its result is the same to the bit (flsuite.federation.sgd).
        # local.loop: compiled runs an epoch's full batches as compiled calls (flsuite.federation.compiled).
        optimizer = self.optimizers().optimizer
        compiled = self.local.loop == "compiled"
        clear_grads, step = grad_clearer(optimizer), optimizer_step(optimizer, fused=compiled)

        offsets = self.gradient_offset_pairs()

        def one_step(x: torch.Tensor, y: torch.Tensor, backward: Callable) -> torch.Tensor:
            clear_grads()
            loss = backward(x, y)
            add_to_gradients(offsets)
            self.before_optimizer_step()
            step()
            self.after_optimizer_step()
            self.num_steps += 1
            return loss.detach()

        device = self.device
        if compiled:
            if self._compiled_steps is None:
                self._compiled_steps = CompiledSteps(self, optimizer)
            on_device = [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in epoch_batches]
            losses = torch.cat(self._compiled_steps.epoch(on_device, one_step)) if on_device else None
        else:
            stepped = []
            for x, y in epoch_batches:
                if x.device != device:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                stepped.append(one_step(x, y, self.eager_backward))
            losses = torch.stack(stepped) if stepped else None
        if losses is not None:  # float64 running sum, in step order (cumsum is sequential on the CPU: the same bits as adding each)
            self._loss_sum += losses.double().cumsum(0)[-1].cpu()

    def eager_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The lean loop's gradient: `local_loss` on the batch, `backward()` into `.grad`; returns the loss."""
        loss = self.local_loss(x, y)
        loss.backward()
        return loss

    # ---- the standard loop (local.loop: standard) ------------------------------------------------------------
    def standard_training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One batch under Lightning's automatic optimisation (run_client sets it for `local.loop: standard`):
        Lightning zeroes the gradients, backpropagates the returned loss through its precision plugin (autocast,
        gradient scaling) and steps the optimiser; the method hooks run from `on_before_optimizer_step` (gradients
        already unscaled) and `on_train_batch_end`. Same batches, loss and step count as the lean loop."""
        x, y = batch[0].to(self.device, non_blocking=True), batch[1].to(self.device, non_blocking=True)
        loss = self.local_loss(x, y)
        if self._loss_sum.device != loss.device:
            self._loss_sum = self._loss_sum.to(loss.device)  # accumulate on the device: no sync per step
        self._loss_sum += loss.detach()
        self.num_steps += 1
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.automatic_optimization:  # the lean loop calls the hook itself
            add_to_gradients(self.gradient_offset_pairs())
            self.before_optimizer_step()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.automatic_optimization:  # after Lightning's optimiser step (also when a GradScaler skipped it)
            self.after_optimizer_step()

    # ---- hooks for methods -----------------------------------------------------------------------------------
    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective on one batch; FedAvg: cross-entropy."""
        return F.cross_entropy(self.model(x), y)

    def gradient_offset(self) -> dict[str, torch.Tensor]:
        """A constant added to the gradient of each named parameter of `self.model` after every backward, before
        `before_optimizer_step` (e.g. SCAFFOLD's correction c − c_k); empty (the default): none. Read at the start of
        every epoch, so it must stay fixed for the fit. Unlike a hook, `local.loop: compiled` folds it into the
        steps it compiles together (flsuite.federation.compiled)."""
        return {}

    def gradient_offset_pairs(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """`gradient_offset` as (parameter, offset) pairs, in `self.model`'s parameter order."""
        offset = self.gradient_offset()
        return [(p, offset[n]) for n, p in self.model.named_parameters() if n in offset] if offset else []

    def before_optimizer_step(self) -> None:
        """Called after backward (and `gradient_offset`), before the optimiser step (e.g. gradient clipping)."""

    def after_optimizer_step(self) -> None:
        """Called after each optimiser step."""

    def upload(self) -> dict[str, Any]:
        """Extras sent to the server besides the weights (e.g. prototypes, control-variate deltas)."""
        return {}

    def next_state(self) -> State:
        """This client's state for its next round; by default unchanged."""
        return self.task.state

    @property
    def mean_loss(self) -> float:
        """The mean mini-batch loss of this fit so far (float64 sum over steps / steps)."""
        return float(self._loss_sum) / max(self.num_steps, 1)

    # ---- result ----------------------------------------------------------------------------------------------
    def result(self, num_samples: int) -> ClientResult:
        """Package the fit's outcome for the server (weights on the CPU)."""
        weights: Weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        return ClientResult(
            client_id=self.task.client_id,
            num_samples=num_samples,
            weights=weights,
            upload=self.upload(),
            state=self.next_state(),
            train_loss=self.mean_loss,
            num_steps=self.num_steps,
        )


class Method:
    """Server side of an FL method. The defaults are FedAvg's: nothing extra is sent or kept, and weights are
    averaged ∝ client sample count.

    Subclasses set `client_module` to their `ClientModule` subclass and override the hooks they need. Hooks receive
    state and return new state: the loop commits a round only when it has completed. Clients see the method through
    `HyperParameters`, a read-only snapshot taken when the run starts, never the live server object.
    """

    client_module: ClassVar[type[ClientModule]] = ClientModule
    #: Set by `setup`: the number of clients this method trains over, and which state-dict entries are trainable
    #: parameters (the others are buffers, e.g. BatchNorm statistics).
    num_clients: int = 0
    parameter_names: tuple[str, ...] = ()

    def setup(self, model: nn.Module, num_clients: int) -> None:
        """Called by the round loop once per run (and on resume) before any other hook."""
        self.num_clients = num_clients
        self.parameter_names = tuple(n for n, p in model.named_parameters() if p.requires_grad)

    def protocol(self) -> list[Phase]:
        """The phases this method runs when the config gives no `protocol:`; by default rounds of this method over
        every client. A multi-stage method (e.g. cluster, train experts, calibrate a head) returns its own."""
        from flsuite.federation.phases import Rounds

        return [Rounds()]

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
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx: ServerContext | None = None
    ) -> tuple[Weights, State]:
        """New global weights and server state from this round's client results. `ctx` (given by the loop) offers
        the server's derived random stream, server-side fits and the round's context (see `ServerContext`)."""
        from flsuite.federation.weights import weighted_average

        return weighted_average([r.weights for r in results], self.aggregation_coefficients(results)), server_state

    def server_update(self, ctx: ServerContext, weights: Weights, server_state: State) -> ServerUpdate:
        """Optional server-side training after aggregation: returns the new weights, state and metrics to log."""
        from flsuite.federation.server import ServerUpdate

        return ServerUpdate(weights, server_state)

    # ---- communication accounting ----------------------------------------------------------------------------
    def bytes_down(self, task: ClientTask) -> int:
        """Bytes the server sends to one client in a round: the global weights and its broadcast."""
        return num_bytes(task.global_weights) + num_bytes(task.broadcast)

    def bytes_up(self, result: ClientResult) -> int:
        """Bytes one client sends back: by default its weights and its upload. A method whose upload replaces the
        weights (e.g. SCAFFOLD's deltas) counts only what really leaves the client."""
        return num_bytes(result.weights) + num_bytes(result.upload)


class HyperParameters:
    """A read-only snapshot of a method for clients: attribute reads go to a deep copy taken at run start, writes
    fail. Serial and Ray clients therefore see the same values, whatever the server does to its own object."""

    def __init__(self, method: Method) -> None:
        object.__setattr__(self, "_method", copy.deepcopy(method))

    def __getattr__(self, name: str) -> Any:  # only called for names not found on self, i.e. all but `_method`
        if name == "_method":  # not set yet (unpickling before __setstate__)
            raise AttributeError(name)
        return getattr(self._method, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"clients see the method's hyperparameters read-only (tried to set {name!r}); send per-round values through broadcast")

    def __getstate__(self) -> dict[str, Any]:
        return {"_method": self._method}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "_method", state["_method"])
