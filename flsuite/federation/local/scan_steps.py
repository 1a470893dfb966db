"""SGD steps as one `scan` (torch's loop operator): the compiled loop's form for a run of full batches
(`flsuite.federation.local.compiled.CompiledSteps`), on stacked batches (`_sgd_steps`) or on a streamed epoch's rows
gathered inside the scan (`_gathered_sgd_steps`), compiled once per client class and parameter layout."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from flsuite.federation.local.dynamo import Layout, compiled_copy
from flsuite.federation.local.loss_grads import _LocalLoss, _loss_grad_and_value
from flsuite.federation.local.sgd import is_wrapper_free_sgd

if TYPE_CHECKING:
    from flsuite.federation.method import ClientModule


def _torch_scan() -> Callable[..., Any] | None:
    """torch's loop operator, a prototype API (torch._higher_order_ops): without it every step is its own call."""
    try:
        from torch._higher_order_ops.scan import scan
    except ImportError:  # pragma: no cover - depends on the installed torch
        return None
    return scan


scan = _torch_scan()


def _sgd_steps(
    loss_module: _LocalLoss,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    offsets: dict[str, torch.Tensor],
    lr: torch.Tensor,
    rule: tuple[float, float, float, bool, bool],
    xs: torch.Tensor,
    ys: torch.Tensor,
):
    """len(xs) SGD steps, the t-th on batch (xs[t], ys[t]), as one `scan`: each step differentiates the loss at the
    current parameters, adds the method's constant gradient offset o (`ClientModule.gradient_offset`, 0 where it has
    none) and applies torch's SGD rule (torch.optim.SGD's documentation), with the momentum buffers b already created
    (by the fit's first, eager step):

        g = ∇L(θ) + o,  d = ±g + λθ,  b ← μ b + (1 − τ) d,  d ← d + μ b (Nesterov) or b,  θ ← θ − η d

    (rule = (μ, τ, λ, nesterov, maximize); no buffers when μ = 0). Returns the parameters, buffers, the last step's
    g (what `.grad` holds after it), the t losses and the t steps' statistics (stacked)."""
    step = _sgd_step(loss_module, offsets, lr, rule)
    return _scanned(step, params, buffers, (xs, ys))


def _gathered_sgd_steps(
    loss_module: _LocalLoss,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    offsets: dict[str, torch.Tensor],
    lr: torch.Tensor,
    rule: tuple[float, float, float, bool, bool],
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
):
    """`_sgd_steps` on a streamed epoch (`flsuite.data.base.StreamedEpoch`): the t-th batch is (x[rows[t]],
    y[rows[t]]), gathered inside the scan's step, so the run of batches is never stacked (FKPL's server head: 83,000
    × 3840 features, a 1.3 GB copy an epoch; docs/performance.md, "Server fits")."""
    step = _sgd_step(loss_module, offsets, lr, rule)

    def gathered(carry, batch_rows):
        return step(carry, (x[batch_rows], y[batch_rows]))

    return _scanned(gathered, params, buffers, rows)


def _sgd_step(loss_module: _LocalLoss, offsets: dict[str, torch.Tensor], lr: torch.Tensor, rule) -> Callable:
    """The scan's body of `_sgd_steps`: (carry, (x, y)) → (carry, (loss, statistics)), carry = (θ, b, g)."""
    momentum, dampening, weight_decay, nesterov, maximize = rule
    grad_and_value = _loss_grad_and_value(loss_module)

    def step(carry, batch):
        p, b, _ = carry
        grads, (value, statistics) = grad_and_value(p, *batch)
        grads = {n: g + offsets[n] if n in offsets else g for n, g in grads.items()}
        new_p, new_b = {}, {}
        for n, w in p.items():
            d = -grads[n] if maximize else grads[n]
            if weight_decay != 0:
                d = d + weight_decay * w
            if momentum != 0:
                new_b[n] = b[n] * momentum + (1 - dampening) * d
                d = d + momentum * new_b[n] if nesterov else new_b[n]
            new_p[n] = w - lr * d
        # a scan's outputs may not alias its inputs (a statistic can be the batch's labels): copies
        return (new_p, new_b, grads), (value, {k: v.clone() for k, v in statistics.items()})

    return step


def _scanned(step: Callable, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], xs):
    """`step` scanned over `xs` from (params, buffers, zero gradients): (params, buffers, grads, losses, statistics)."""
    init = (params, buffers, {n: torch.zeros_like(w) for n, w in params.items()})
    assert scan is not None, "only called where scans_sgd holds, which needs torch's scan"
    (params, buffers, grads), (losses, statistics) = scan(step, init, xs)
    return params, buffers, grads, losses, statistics


@functools.cache
def compiled_sgd_steps(layout: Layout) -> Callable:
    """`_sgd_steps` compiled, one function per client class and parameter layout, kept for the process. The number
    of steps is a dynamic dimension (`mark_dynamic` on the stacked batches): one graph for every run length."""
    return compiled_copy(_sgd_steps, layout, compiled_sgd_steps.cache_info().currsize)


@functools.cache
def compiled_gathered_sgd_steps(layout: Layout) -> Callable:
    """`_gathered_sgd_steps` compiled, as `compiled_sgd_steps` (the run length and the source's rows dynamic)."""
    return compiled_copy(_gathered_sgd_steps, layout, compiled_gathered_sgd_steps.cache_info().currsize)


def scans_sgd(client: ClientModule, optimizer: torch.optim.Optimizer) -> bool:
    """Whether a fit can run its runs of full batches as one scanned call each: the optimiser is torch's plain SGD
    with nothing around its step (`is_wrapper_free_sgd`, one parameter group) and the method
    declares no step hooks (`ClientModule.step_hooks`), so there is nothing to call between two steps."""
    return (
        scan is not None
        and is_wrapper_free_sgd(optimizer)
        and len(optimizer.param_groups) == 1
        and not client.step_hooks
    )


def stacked(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(tensors)` at offset 0 of its storage. Consecutive equal pieces of one contiguous tensor (an
    epoch's batches: `split` views of one gather) are viewed in place instead of copied, if they start it."""
    first = tensors[0]
    size, storage, offset = first.numel(), first.untyped_storage().data_ptr(), first.storage_offset()
    if offset == 0 and all(
        t.is_contiguous()
        and t.shape == first.shape
        and t.storage_offset() == i * size
        and t.untyped_storage().data_ptr() == storage
        for i, t in enumerate(tensors)
    ):
        return first.as_strided((len(tensors), *first.shape), (size, *first.stride()), 0)
    return torch.stack(list(tensors))
