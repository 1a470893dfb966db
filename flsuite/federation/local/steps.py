"""The pieces of one local step that every loop shares: the batch loss and its statistics, the eager gradient, the
method's gradient offset, and the once-per-fit `probe`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, LocalLoss


def split_loss(out: LocalLoss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`local_loss`'s value as (loss, statistics); no statistics: {}."""
    return out if isinstance(out, tuple) else (out, {})


def gather(client: ClientModule, fit: FitStatistics, statistics: dict[str, torch.Tensor]) -> None:
    """One step's statistics: the FL-task loss (`ClientModule.TASK_LOSS`) to the fit's `add_task_loss`, the rest
    detached to `client.gather`, with no gradient recorded; nothing left to gather: no call."""
    if not statistics:
        return
    with torch.no_grad():
        rest = {k: v.detach() for k, v in statistics.items() if k != client.TASK_LOSS}
        if client.TASK_LOSS in statistics:
            fit.add_task_loss(statistics[client.TASK_LOSS])
        if rest:
            client.gather(rest)


def batch_loss(client: ClientModule, fit: FitStatistics, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`local_loss` on the batch, its statistics gathered; returns the loss (still to be differentiated)."""
    loss, statistics = split_loss(client.local_loss(x, y))
    gather(client, fit, statistics)
    return loss


def eager_backward(client: ClientModule, fit: FitStatistics, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The lean loop's gradient: `batch_loss`, `backward()` into `.grad`; returns the loss."""
    loss = batch_loss(client, fit, x, y)
    loss.backward()
    return loss


def gradient_offset_pairs(client: ClientModule) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """`client.gradient_offset()` as (parameter, offset) pairs, in the model's parameter order."""
    offset = client.gradient_offset()
    return [(p, offset[n]) for n, p in client.model.named_parameters() if n in offset] if offset else []


def add_to_gradients(offsets: Sequence[tuple[nn.Parameter, torch.Tensor]]) -> None:
    """`p.grad += offset` for each (parameter, offset) pair whose parameter got a gradient."""
    for p, offset in offsets:
        if p.grad is not None:
            p.grad.add_(offset)


def probe(client: ClientModule, x: torch.Tensor, y: torch.Tensor) -> None:
    """`client.probe(x, y)` without a trace in the training: torch's RNG forked (CPU and the batch's CUDA device),
    autocast off, gradients on, the model's buffers (e.g. BatchNorm statistics) restored afterwards. Not called
    where the client keeps `ClientModule.probe`'s default."""
    if type(client).probe is ClientModule.probe:
        return
    saved = [(b, b.detach().clone()) for b in client.model.buffers()]
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.autocast(x.device.type, enabled=False), torch.enable_grad():
        client.probe(x, y)
    with torch.no_grad():
        for b, value in saved:
            b.copy_(value)
