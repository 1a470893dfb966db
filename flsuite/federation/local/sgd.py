"""The lean client loop's optimiser calls, without `torch.optim`'s per-call wrapper, in the same bits.

`Optimizer.step()` and `zero_grad()` wrap their work in a profiler range, hook dispatch, a dynamo guard and a
grad-mode switch, a large share of a small head's step (measured: docs/performance.md).

- `optimizer_step(optimizer)` is `optimizer.step` unless the optimiser is a CPU `torch.optim.SGD` that step() would
  run through torch's single-tensor SGD with nothing around it (`is_wrapper_free_sgd`). Then it calls torch's own
  functional SGD (`torch.optim.sgd.sgd`, what `SGD.step` calls) with the arguments step() would pass, read from the
  param groups and `optimizer.state` on every call, and stores the momentum buffers back as step() does: the result
  is step()'s to the bit.
- `grad_clearer(optimizer)` sets each parameter's `.grad` to None, which is what `zero_grad(set_to_none=True)` does
  (unless the optimiser class overrides zero_grad).

Both decide once, when called (once per epoch); what they return runs every batch. The steps no longer appear as
`Optimizer.step#SGD.step` ranges in a torch.profiler trace.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.optim.optimizer as torch_optimizer
from torch.optim.sgd import sgd as functional_sgd


def grad_clearer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """A function equal to `optimizer.zero_grad(set_to_none=True)` over the current param groups."""
    if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad:
        return partial(optimizer.zero_grad, set_to_none=True)
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def clear_grads() -> None:
        for p in params:
            p.grad = None

    return clear_grads


def optimizer_step(optimizer: torch.optim.Optimizer, fused: bool = False) -> Callable[[], None]:
    """`optimizer.step`, or, where `is_wrapper_free_sgd`, torch's functional SGD called as step() would call it;
    `fused=True` runs it as `SGD(fused=True)` would (one kernel for every parameter's update; other last bits)."""
    if not is_wrapper_free_sgd(optimizer):
        return optimizer.step

    def sgd_step() -> None:
        with torch.no_grad():
            for group in optimizer.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                grads = [p.grad for p in params]
                momentum = group["momentum"]
                buffers = [optimizer.state[p].get("momentum_buffer") for p in params] if momentum != 0 else []
                functional_sgd(
                    params,
                    grads,
                    buffers,
                    has_sparse_grad=any(g.is_sparse for g in grads),
                    foreach=False,
                    fused=fused,
                    weight_decay=group["weight_decay"],
                    momentum=momentum,
                    lr=group["lr"],
                    dampening=group["dampening"],
                    nesterov=group["nesterov"],
                    maximize=group["maximize"],
                )
                if momentum != 0:
                    for p, buffer in zip(params, buffers):
                        optimizer.state[p]["momentum_buffer"] = buffer

    return sgd_step


def is_wrapper_free_sgd(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` is exactly torch's single-tensor SGD under no_grad with nothing else run: a
    `torch.optim.SGD` (not a subclass) whose step is not patched on the instance (an LR scheduler's counter), with
    no step hooks (its own or global), no gradient scaler attached, and every group neither differentiable nor fused
    nor foreach, over CPU parameters (where torch's default is the single-tensor loop)."""
    if type(optimizer) is not torch.optim.SGD or "step" in vars(optimizer):
        return False
    hooks = [
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
        getattr(torch_optimizer, "_global_optimizer_post_hooks", None),
    ]
    if any(h is None or len(h) > 0 for h in hooks):  # a hook, or a torch that keeps them elsewhere
        return False
    if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
        return False
    return all(
        not group.get("differentiable", True)
        and not group.get("fused")
        and not group.get("foreach")
        and all(p.device.type == "cpu" for p in group["params"])
        for group in optimizer.param_groups
    )
