"""`local.loop: compiled`: the lean loop with each batch's forward and backward as one compiled graph.

On a small head (Linear(1280, 10), batch 16, one CPU thread) an eager step is ~200 µs for ~1 MFLOP: the time is
autograd's graph recording and engine start (~24 µs for any `backward()`, 4-11 per further node), one dispatch per kernel and torch.optim's
per-tensor update, not arithmetic. Here the method's own `local_loss` is differentiated once, at trace time, with
`torch.func.grad_and_value` over the trainable parameters and compiled (`torch.compile`, inductor, `fullgraph=True`):
each step is then one call running the forward and backward kernels with nothing recorded, and the optimiser is
torch's fused SGD (`fused=True`: one kernel for the update of every parameter).

What stays the same as the lean loop: one Lightning fit per client, the same batches, every method hook
(`before_optimizer_step` sees the gradients in `.grad`, as after `backward()`), the same update rule. What differs:
the last bits (inductor fuses and reorders the kernels; the fused update rounds differently), so a compiled run is a
different seed-level sample of the same training, not a rerun of a lean one; two compiled runs on the same machine
and thread count are the same to the bit.

A parameter the loss does not reach keeps `.grad = None` as after `backward()` (so weight decay and momentum leave
it alone): the first step of every fit runs eagerly and records which parameters got a gradient; the compiled steps
differentiate only those. A `local_loss` dynamo cannot capture in one graph (data-dependent Python branches, `.item()`,
side effects on Python objects) fails at its first compiled step with an error that names the method and says to use
`local.loop: lean`. Only full batches are compiled (static shapes: one graph; an epoch's smaller last batch runs
eagerly); the graph is kept per process (the first fit pays the compilation, seconds) and is recompiled only when a
method attribute the loss reads as a constant changes.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from flsuite.methods.base import ClientModule


class _LocalLoss(nn.Module):
    """The client's `local_loss` as a module's forward, so `torch.func.functional_call` can swap its parameters."""

    def __init__(self, client: ClientModule) -> None:
        super().__init__()
        self.client = client

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.client.local_loss(x, y)


def _loss_and_grads(loss_module: _LocalLoss, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(loss_module, p, (x, y))

    grads, value = torch.func.grad_and_value(loss)(params)
    return value, grads


Layout = tuple[type, tuple[tuple[str, torch.Size, torch.dtype, torch.device], ...]]


@functools.cache
def compiled_loss_and_grads(layout: Layout) -> Callable:
    """`_loss_and_grads` compiled, one function per client class and parameter layout, kept for the process.

    Dynamo keeps its graphs (and counts recompilations against `torch._dynamo.config.recompile_limit`) per code
    object, so each layout gets its own copy of the code: a process that runs several methods or models (a test
    session, an in-process sweep) never exhausts one shared budget, and a fit reuses the graph of the earlier fits
    of its kind. Static shapes: only full batches are compiled (see CompiledBackward), so a layout needs one graph,
    plus one per value of a constant the loss reads (FedDC's correction switching on after round 1)."""
    name = f"loss_and_grads_{layout[0].__name__}_{compiled_loss_and_grads.cache_info().currsize}"
    code = _loss_and_grads.__code__.replace(co_name=name, co_qualname=name)  # new code, same bytecode; dynamo's
    fn = types.FunctionType(code, _loss_and_grads.__globals__, name)  # automatic-dynamic state is keyed by name too
    return torch.compile(fn, fullgraph=True, dynamic=False)


class CompiledBackward:
    """Per fit: `backward(x, y)` returns the batch loss and leaves the gradients in `.grad`, like
    `loss = client.local_loss(x, y); loss.backward()` (on parameters whose `.grad` was cleared).

    Full batches (`local.batch_size` samples) go through the compiled graph; the fit's first step and any smaller
    batch (an epoch's last) run eagerly, as in the lean loop — the same computation, one static graph."""

    def __init__(self, client: ClientModule) -> None:
        self.client = client
        self.loss_module = _LocalLoss(client)
        self.trainable = [(n, p) for n, p in self.loss_module.named_parameters() if p.requires_grad]
        self.reached: list[tuple[str, nn.Parameter]] | None = None  # decided by the first (eager) step
        self.compiled: Callable | None = None
        self.full_batch = client.local.batch_size

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.compiled is None or len(y) != self.full_batch:
            return self._eager_step(x, y)
        if x.storage_offset() or y.storage_offset():  # batches are views into the epoch's data, and a static graph
            x, y = x.clone(), y.clone()  # is specialised to its inputs' offsets: give it offset 0 every time
        params = {n: p.detach() for n, p in self.reached}
        try:
            loss, grads = self.compiled(self.loss_module, params, x, y)
        except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as e:
            raise RuntimeError(
                f"local.loop: compiled could not compile {type(self.client).__name__}.local_loss into one graph "
                f"({type(e).__name__}: {_first_line(e)}). Use local.loop: lean for this method."
            ) from e
        for n, p in self.reached:
            p.grad = grads[n]
        return loss

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The lean loop's step. The first one of a fit also records which parameters the loss reaches, and the
        optimiser creates its state (momentum buffers) in it exactly as in the lean loop."""
        loss = self.client.eager_backward(x, y)
        if self.compiled is not None:
            return loss
        self.reached = [(n, p) for n, p in self.trainable if p.grad is not None]
        layout = (type(self.client), tuple((n, p.shape, p.dtype, p.device) for n, p in self.reached))
        self.compiled = compiled_loss_and_grads(layout)
        return loss


def _first_line(error: Exception, limit: int = 400) -> str:
    """The reason in dynamo's message: the operation that failed under fake tensors if it names one, else its first
    line."""
    text = str(error)
    inner = re.search(r"got (\w+Error)\('(.+?)'\)", text, re.DOTALL)
    if inner:
        text = f"{inner.group(1)}: {inner.group(2)}"
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().endswith("raised:")]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
