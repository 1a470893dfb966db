"""Running one client's local training over the method's `ClientModule`: the lean and compiled loops on the CPU by
`run_fit` (no Trainer), else one `Trainer.fit` of a `LocalFit`."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import lightning.fabric.utilities.registry as lightning_registry
import torch
from torch import nn

from flsuite.data.base import FederatedData
from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.local.batches import client_batches
from flsuite.federation.local.choice import outside_a_run
from flsuite.federation.local.loops import ClientFit, LocalFit, run_fit, runs_without_a_trainer
from flsuite.federation.method import ClientModule, HyperParameters
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.federation.transport import Transport
from flsuite.federation.weights import is_finite
from flsuite.models.heads import ModelSpec
from flsuite.runtime import step_flops


@dataclass
class ClientEnvironment:
    """What stays the same for every client task of a run (an executor ships it to workers once)."""

    data: FederatedData
    model: ModelSpec
    method: HyperParameters
    local: LocalTraining
    seed: int

    def build_model(self) -> nn.Module:
        return self.model.build(self.data.input_shape, self.data.num_classes)

    def step_flops(self) -> float:
        """Forward FLOPs of one local batch, what the thread policy decides by (`flsuite.runtime.step_flops`); the
        model is built aside, leaving the random state untouched."""
        with torch.random.fork_rng(devices=[]):
            model = self.build_model()
        return step_flops(model, self.data.input_shape, self.local.batch_size)


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


def run_client(env: ClientEnvironment, task: ClientTask) -> ClientResult:
    """Train client `task.client_id` from the global weights and return its result.

    Randomness (model-internal, e.g. dropout, the batch order and augmentation) comes from streams derived from the
    task's seed, so the result does not depend on which worker runs it or in which order.
    """
    split, local = env.data.clients[task.client_id].train, outside_a_run(env.local)
    torch.manual_seed(task.seed)
    model = env.build_model()
    load_task_weights(model, task, env.method.transport)
    client = env.method.client_module(model=model, method=env.method.settings, local=local, task=task)
    batches, epochs = client_batches(split, local, task.seed)
    if runs_without_a_trainer(local):
        statistics = run_fit(ClientFit(client), batches, epochs)
    else:
        fit = LocalFit(client)
        _scan_callback_entry_points_once()
        make_trainer(local, max_epochs=epochs).fit(fit, train_dataloaders=batches)
        statistics = fit.statistics
    return client_result(client, statistics, env.method.transport, num_samples=len(split))


def load_task_weights(model: nn.Module, task: ClientTask, transport: Transport) -> None:
    """Load what the task carries and what the client holds into `model`; the entries kept on the client
    (`transport.kept`) keep the model's own values. Any other entry missing or unknown: an error."""
    weights = {**task.held, **task.global_weights} if task.held else task.global_weights
    missing, unexpected = model.load_state_dict(weights, strict=False)
    absent = sorted(set(missing) - transport.kept)
    if absent or unexpected:
        raise RuntimeError(
            f"client {task.client_id}'s task does not fit its model: missing {absent}, unexpected {sorted(unexpected)}"
        )


def client_result(client: ClientModule, fit: FitStatistics, transport: Transport, num_samples: int) -> ClientResult:
    """The fit's outcome for the server, built by the engine (not a hook): the weights the method declares travelling
    up (`transport.upward`, CPU copies; nothing else of the model leaves the client), its upload, the client's next
    state, the loop's statistics `fit` and the method's metrics, and whether the whole trained model is finite."""
    weights = client.model.state_dict()
    return ClientResult(
        client_id=client.task.client_id,
        num_samples=num_samples,
        weights={k: v.detach().to("cpu", copy=True) for k, v in transport.upward(weights).items()},
        upload=client.upload(fit),
        state=client.next_state(fit),
        train_loss=fit.mean_loss,
        num_steps=fit.num_steps,
        task_loss=fit.mean_task_loss,
        metrics=client.metrics(fit),
        finite=is_finite(weights),
    )
