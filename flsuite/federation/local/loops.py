"""The local loops: `ClientFit` is one client fit, calling the client's hooks (`flsuite.federation.method.ClientModule`)
under `local.loop` (each first calls the client's `probe` once, on the fit's first batch, isolated from the training:
`flsuite.federation.local.steps.probe`); `run_fit` runs it on the CPU without a Trainer, `LocalFit` through Lightning:

- lean (manual optimisation): one training step per local epoch with that epoch's pre-sliced batches
  (`flsuite.data.base.EpochBatches`); per batch `clear grads → local_loss → backward → + gradient_offset →
  before_optimizer_step → step → after_optimizer_step`, with the raw torch optimiser and `loss.backward()` and
  torch.optim's step without its wrapper where the result is the same to the bit (`flsuite.federation.local.sgd`);
  on the CPU by `run_fit`, which calls what `Trainer.fit` would in its order, without its per-fit set-up (~3 ms,
  most of a small client's fit: docs/performance.md, "Small clients");
- compiled: the lean loop with an epoch's full batches run as compiled calls (`flsuite.federation.local.compiled`);
- standard: Lightning's per-batch automatic optimisation (mixed precision, gradient scaling) through `LocalFit`, the
  hooks from `on_before_optimizer_step` and `on_train_batch_end`; the same batches, loss and step count as the lean
  loop. `LocalFit` also runs the lean and compiled loops on another accelerator (the Trainer moves the model).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import torch

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.compiled import CompiledSteps
from flsuite.federation.local.sgd import grad_clearer, optimizer_step
from flsuite.federation.local.steps import (
    add_to_gradients,
    batch_loss,
    eager_backward,
    gradient_offset_pairs,
    probe,
)
from flsuite.federation.method import ClientModule


class ClientFit:
    """One client's local training in one round (see the module docstring): the loops' work, run without a Trainer by
    `run_fit` (lean and compiled loops on the CPU) or through Lightning by `LocalFit`. It counts the fit's losses and
    steps in `statistics` and hands them to the client's hooks that run after the fit."""

    def __init__(self, client: ClientModule) -> None:
        self.client = client
        self.statistics = FitStatistics()
        self._compiled_steps: CompiledSteps | None = None
        self._probed = False  # `ClientModule.probe` runs once per fit, on its first batch

    def make_optimizer(self) -> torch.optim.Optimizer:
        return self.client.local.make_optimizer(self.client.model.parameters(), round=self.client.task.round)

    def begin(self, device: torch.device, epochs: int) -> None:
        self.client.device, self.client.epochs = device, epochs
        self.client.begin()

    def start_epoch(self, epoch: int) -> None:
        self.client.epoch = epoch

    def end(self) -> None:
        self.client.end(self.statistics)

    def train_epoch(
        self,
        epoch_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        device: torch.device,
    ) -> None:
        """The lean and compiled loops: one epoch's batches, stepped with the torch optimiser itself."""
        client, fit = self.client, self.statistics
        compiled = client.local.loop == "compiled"
        clear_grads, step = grad_clearer(optimizer), optimizer_step(optimizer, fused=compiled)
        offsets = gradient_offset_pairs(client)

        def one_step(x: torch.Tensor, y: torch.Tensor, backward: Callable) -> torch.Tensor:
            clear_grads()
            loss = backward(x, y)
            add_to_gradients(offsets)
            client.before_optimizer_step()
            step()
            client.after_optimizer_step()
            fit.num_steps += 1
            return loss.detach()

        if not self._probed and epoch_batches:
            self.probe(*epoch_batches[0], device)
        if compiled:
            if self._compiled_steps is None:
                self._compiled_steps = CompiledSteps(client, fit, optimizer)
            on_device = (  # on the CPU as they are (a `StreamedEpoch` is read inside the compiled loop)
                epoch_batches
                if device.type == "cpu"
                else [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in epoch_batches]
            )
            losses = torch.cat(self._compiled_steps.epoch(on_device, one_step)) if on_device else None
        else:
            lean = functools.partial(eager_backward, client, fit)
            stepped = []
            for x, y in epoch_batches:
                if x.device != device:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                stepped.append(one_step(x, y, lean))
            losses = torch.stack(stepped) if stepped else None
        if (
            losses is not None
        ):  # float64 running sum, in step order (cumsum is sequential on the CPU: the same bits as adding each)
            fit.add_loss(losses.double().cumsum(0)[-1].cpu())

    def probe(self, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
        """The client's `probe` on the fit's first batch, before its first step (every loop; isolated:
        `steps.probe`)."""
        self._probed = True
        probe(self.client, x.to(device), y.to(device))

    def standard_step(self, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> torch.Tensor:
        """One batch of the standard loop: the loss Lightning backpropagates and steps on."""
        fit = self.statistics
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        if not self._probed:
            self.probe(x, y, device)
        loss = batch_loss(self.client, fit, x, y)
        fit.add_loss(loss.detach())  # on the loss's device: no sync per step
        fit.num_steps += 1
        return loss


def runs_without_a_trainer(loop: str, accelerator: str, precision: str = "32-true") -> bool:
    """Whether a fit takes `run_fit`: the lean and compiled loops (32-bit) on the CPU, where Lightning's Trainer adds
    nothing but its set-up; it still runs the standard loop (automatic optimisation, mixed precision) and moves the
    model to another accelerator."""
    return loop != "standard" and accelerator == "cpu" and precision == "32-true"


def run_fit(
    fit: ClientFit, batches: Iterable, epochs: int, on_epoch_end: Callable[[], object] | None = None
) -> FitStatistics:
    """The lean or compiled loop on the CPU without a Trainer: what `Trainer.fit` of `LocalFit` calls, in its order
    (the optimiser, `begin`, then per epoch `start_epoch` and one training step per item of a fresh iteration of
    `batches`, one item per epoch, then `end`), without its per-fit set-up (docs/performance.md, "Small clients").
    The same results to the bit (tests/federation/local/test_run_fit.py)."""
    optimizer = fit.make_optimizer()
    device = torch.device("cpu")
    with torch.enable_grad():  # as Lightning's fit loop trains, whatever the caller's grad mode
        fit.begin(device, epochs)
        for epoch in range(epochs):
            fit.start_epoch(epoch)
            for epoch_batches in batches:
                fit.train_epoch(epoch_batches, optimizer, device)
            if on_epoch_end is not None:
                on_epoch_end()
        fit.end()
    return fit.statistics
