"""Lightning's side of the local loops: `LocalFit`, the `LightningModule` around a `ClientFit` that `Trainer.fit` runs
(the standard loop; the lean and compiled loops on an accelerator other than the CPU; the server's `fit` of its own
Lightning modules), and the lean `Trainer` they run in. Imported only where a fit takes a Trainer: the lean and
compiled loops on the CPU (`flsuite.federation.local.loops.run_fit`) and the processes that run only them (a Ray
worker) import neither Lightning nor the torchmetrics it pulls in (a worker's imports: 3.2 s instead of 4.8 s here)."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import lightning.fabric.utilities.registry as lightning_registry
import torch

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.loops import ClientFit
from flsuite.federation.local.steps import add_to_gradients, gradient_offset_pairs
from flsuite.federation.method import ClientModule
from flsuite.federation.task import LocalTraining

#: Lightning's loggers and the levels client fits set them to (no banners or per-fit hints).
_QUIET_LEVELS = (
    ("lightning.pytorch", logging.WARNING),
    ("lightning.fabric", logging.WARNING),
    ("lightning", logging.WARNING),
    ("lightning.pytorch.utilities.rank_zero", logging.ERROR),
    ("lightning.pytorch.accelerators.cuda", logging.ERROR),
)
#: Warnings ignored in client fits; the last is Lightning's pytree vs newer torch, once per fit.
_QUIET_WARNINGS = (r".*does not have many workers.*", r".*GPU available but not used.*", r".*treespec, LeafSpec.*")
#: The first entries of `warnings.filters` as `_quiet_lightning` last left them.
_quiet_filters: list[object] | None = None


def _quiet_lightning() -> None:
    """Client fits are many and tiny: no banners ("GPU available…") or dataloader-worker hints per client. Set up by
    `make_trainer`, so a server-side fit is as quiet when no client fit ran in its process (clients on Ray workers).

    Called per fit, it only sets what is not already set: `Logger.setLevel` clears the level cache of every logger
    of the process even when the level stays the same, and `warnings.filterwarnings` re-inserts its filter and
    resets every module's warning registry; when `warnings.filters` already starts with this function's filters in
    its order (nothing was put before them since), adding them again would leave the same list."""
    global _quiet_filters
    for name, level in _QUIET_LEVELS:
        logger = logging.getLogger(name)
        if logger.level != level:
            logger.setLevel(level)
    if _quiet_filters is None or list(warnings.filters[: len(_QUIET_WARNINGS)]) != _quiet_filters:
        for message in _QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        _quiet_filters = list(warnings.filters[: len(_QUIET_WARNINGS)])


_cached_entry_points: Callable[..., tuple] | None = None


def _scan_callback_entry_points_once() -> None:
    """Every `Trainer.__init__` scans every installed distribution's metadata for Lightning's external-callback entry
    points, most of a tiny client fit's fixed cost (docs/performance.md); client fits build one Trainer each, so the
    lookup's result is kept for the process (Lightning's registry module gets a cached `entry_points`). The factories
    found are still loaded and called for every Trainer; a Lightning whose registry has no `entry_points` is left
    alone. Not seen: a package installed into the environment while the process runs."""
    global _cached_entry_points
    current = getattr(lightning_registry, "entry_points", None)
    if current is None or current is _cached_entry_points:
        return

    @functools.cache
    def entry_points(**selection: str) -> tuple:
        return tuple(current(**selection))

    _cached_entry_points = entry_points
    vars(lightning_registry)["entry_points"] = entry_points


def fit_in_a_trainer(fit: LocalFit, batches: Any, local: LocalTraining, epochs: int) -> None:
    """One client fit as `Trainer.fit` of `fit` (`local`'s accelerator and precision)."""
    _scan_callback_entry_points_once()
    make_trainer(local, max_epochs=epochs).fit(fit, train_dataloaders=batches)


def make_trainer(local: LocalTraining, max_epochs: int, callbacks: list[L.Callback] | None = None) -> L.Trainer:
    """A lean Trainer for one client fit: no logger, checkpointing, progress bar, model summary or sanity check."""
    _quiet_lightning()
    return L.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        accelerator=local.accelerator,
        devices=1,
        precision=local.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1_000_000,
    )


class LocalFit(L.LightningModule):
    """A `ClientFit` run by `Trainer.fit`: the standard loop (Lightning's automatic optimisation) and the lean and
    compiled loops on an accelerator other than the CPU."""

    def __init__(self, client: ClientModule) -> None:
        super().__init__()
        self.work = ClientFit(client)
        self.automatic_optimization = client.local.loop == "standard"

    @property
    def statistics(self) -> FitStatistics:
        return self.work.statistics

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.work.make_optimizer()

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # an epoch's list of batches; each batch is moved in training_step

    def on_fit_start(self) -> None:
        self.work.begin(self.device, int(self.trainer.max_epochs or 1))

    def on_train_epoch_start(self) -> None:
        self.work.start_epoch(self.current_epoch)

    def on_fit_end(self) -> None:
        self.work.end()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        """The lean and compiled loops: `batch` is an epoch's list of batches, stepped with the torch optimiser itself
        (without Lightning's wrapper); the standard loop: one batch, whose loss Lightning zeroes the gradients for,
        backpropagates through its precision plugin (autocast, gradient scaling) and steps the optimiser on."""
        if self.automatic_optimization:
            return self.work.standard_step(batch, self.device)
        self.work.train_epoch(batch, self.trainer.optimizers[0], self.device)
        return None

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.automatic_optimization:  # the lean loop calls the hooks itself (gradients already unscaled here)
            add_to_gradients(gradient_offset_pairs(self.work.client))
            self.work.client.before_optimizer_step()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.automatic_optimization:  # after Lightning's optimiser step (also when a GradScaler skipped it)
            self.work.client.after_optimizer_step()


class EpochTicks(L.Callback):
    """Moves a bar by one per finished epoch (the lean loop runs a whole epoch in one training step)."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bar.update(1)
