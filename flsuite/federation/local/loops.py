"""The local loops: `LocalFit` is the `LightningModule` of one client fit, calling the client's hooks
(`flsuite.federation.method.ClientModule`) under `local.loop` (each first calls the client's `probe` once, on the
fit's first batch, isolated from the training: `flsuite.federation.local.steps.probe`):

- lean (manual optimisation): Lightning calls `training_step` once per local epoch with that epoch's pre-sliced
  batches (`flsuite.data.base.EpochBatches`); per batch `clear grads → local_loss → backward → + gradient_offset →
  before_optimizer_step → step → after_optimizer_step`, with the raw torch optimiser and `loss.backward()` (no
  per-batch Lightning wrapper work; correct because client Trainers run on one device in 32-bit precision) and
  torch.optim's step without its wrapper where the result is the same to the bit (`flsuite.federation.local.sgd`);
- compiled: the lean loop with an epoch's full batches run as compiled calls (`flsuite.federation.local.compiled`);
- standard: Lightning's per-batch automatic optimisation (mixed precision, gradient scaling), the hooks from
  `on_before_optimizer_step` and `on_train_batch_end`; the same batches, loss and step count as the lean loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
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


class LocalFit(L.LightningModule):
    """One client's local training in one round, run by `Trainer.fit` (see the module docstring). It counts the
    fit's losses and steps in `statistics` and hands them to the client's hooks that run after the fit."""

    def __init__(self, client: ClientModule) -> None:
        super().__init__()
        self.client = client
        self.statistics = FitStatistics()
        self.automatic_optimization = client.local.loop == "standard"
        self._compiled_steps: CompiledSteps | None = None
        self._probed = False  # `ClientModule.probe` runs once per fit, on its first batch

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.client.local.make_optimizer(self.client.model.parameters(), round=self.client.task.round)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # an epoch's list of batches; each batch is moved in training_step

    def on_fit_start(self) -> None:
        self.client.device, self.client.epochs = self.device, int(self.trainer.max_epochs or 1)
        self.client.begin()

    def on_train_epoch_start(self) -> None:
        self.client.epoch = self.current_epoch

    def on_fit_end(self) -> None:
        self.client.end(self.statistics)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        """The lean and compiled loops: `batch` is an epoch's list of batches; the standard loop: one batch."""
        if self.automatic_optimization:  # local.loop: standard, one batch per step
            return self.standard_training_step(batch, batch_idx)
        epoch_batches: Sequence[tuple[torch.Tensor, torch.Tensor]] = batch
        client, fit = self.client, self.statistics
        optimizer = self.trainer.optimizers[0]  # the torch optimiser itself, stepped without Lightning's wrapper
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

        device = self.device
        if not self._probed and epoch_batches:
            self._probe(*epoch_batches[0])
        if compiled:
            if self._compiled_steps is None:
                self._compiled_steps = CompiledSteps(client, fit, optimizer)
            on_device = [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in epoch_batches]
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
        return None

    def _probe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The client's `probe` on the fit's first batch, before its first step (every loop; isolated:
        `steps.probe`)."""
        self._probed = True
        probe(self.client, x.to(self.device), y.to(self.device))

    def standard_training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One batch under Lightning's automatic optimisation: Lightning zeroes the gradients, backpropagates the
        returned loss through its precision plugin (autocast, gradient scaling) and steps the optimiser."""
        fit = self.statistics
        x, y = batch[0].to(self.device, non_blocking=True), batch[1].to(self.device, non_blocking=True)
        if not self._probed:
            self._probe(x, y)
        loss = batch_loss(self.client, fit, x, y)
        fit.add_loss(loss.detach())  # on the loss's device: no sync per step
        fit.num_steps += 1
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.automatic_optimization:  # the lean loop calls the hooks itself (gradients already unscaled here)
            add_to_gradients(gradient_offset_pairs(self.client))
            self.client.before_optimizer_step()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.automatic_optimization:  # after Lightning's optimiser step (also when a GradScaler skipped it)
            self.client.after_optimizer_step()
