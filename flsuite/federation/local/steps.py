"""The pieces of one local step that every loop shares: the eager gradient and the method's gradient offset."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from flsuite.federation.method import ClientModule


def eager_backward(client: ClientModule, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The lean loop's gradient: `local_loss` on the batch, `backward()` into `.grad`; returns the loss."""
    loss = client.local_loss(x, y)
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
