"""A client's `local_loss` as a function of its parameters (torch.func): differentiated, and compiled per layout."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from flsuite.federation.local.dynamo import Layout, compiled_copy
from flsuite.federation.local.steps import split_loss

if TYPE_CHECKING:
    from flsuite.federation.method import ClientModule


class _LocalLoss(nn.Module):
    """The client's `local_loss` as a module's forward, so `torch.func.functional_call` can swap its parameters;
    returns (loss, statistics), statistics {} where the method gathers none."""

    def __init__(self, client: ClientModule) -> None:
        super().__init__()
        self.client = client

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return split_loss(self.client.local_loss(x, y))


def _loss_grad_and_value(loss_module: _LocalLoss) -> Callable:
    """(params, x, y) → (∇_params loss, (loss, statistics)): the client's loss as a function of the parameters it is
    given; the statistics are an auxiliary output, not differentiated."""

    def loss(
        p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return torch.func.functional_call(loss_module, p, (x, y))

    return torch.func.grad_and_value(loss, has_aux=True)


def _loss_and_grads(loss_module: _LocalLoss, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    grads, (value, statistics) = _loss_grad_and_value(loss_module)(params, x, y)
    return value, grads, statistics


@functools.cache
def compiled_loss_and_grads(layout: Layout) -> Callable:
    """`_loss_and_grads` compiled, one function per client class and parameter layout, kept for the process.
    Static shapes: only full batches are compiled (see CompiledBackward), so a layout needs one graph, plus one per
    value of a constant the loss reads (FedDC's correction switching on after round 1)."""
    return compiled_copy(_loss_and_grads, layout, compiled_loss_and_grads.cache_info().currsize)
