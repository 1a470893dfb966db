"""`local.loop: compiled`: the lean loop with its steps compiled, a whole run of batches per call where it can.

On a small head (Linear(1280, 10), batch 16, one CPU thread) an eager step is ~200-300 µs for ~1 MFLOP: the time is
autograd's graph recording and engine start (~24 µs for any `backward()`, 4-11 per further node), one dispatch per
kernel and torch.optim's per-tensor update, not arithmetic; a compiled call costs ~60 µs before any work. Here the
method's own `local_loss` is differentiated once, at trace time (`torch.func.grad_and_value` over the trainable
parameters), and compiled (`torch.compile`, inductor, `fullgraph=True`), in one of two forms:

- **A run of batches per call** (`CompiledSteps`, where `scans_sgd` holds: torch's plain SGD and no method code
  between two steps, i.e. the default `before_optimizer_step`/`after_optimizer_step`; a constant
  `gradient_offset`, SCAFFOLD's correction, is folded into the steps). An epoch's consecutive full
  batches are one `scan` (torch's loop operator, `torch._higher_order_ops.scan`) over `_sgd_steps`: gradient and SGD
  update of every step in one graph, compiled once for every run length (the length is a dynamic dimension). The
  fixed cost of a call is paid once per epoch instead of once per step.
- **One call per batch** (`CompiledBackward`) otherwise (a method with step hooks, Adam/AdamW): each full
  batch's forward and backward are one call, the gradients go to `.grad` for the method's hooks, and the update is
  torch's fused SGD (`fused=True`) or the optimiser's own `step()`. Also where dynamo can capture the loss for one
  batch but not inside a scan (boolean-mask indexing: a shape that depends on the data): the first scan fails to
  compile, a warning says so, and that layout steps per batch for the rest of the process.

What stays the same as the lean loop: one Lightning fit per client, the same batches, the same update rule, the
method's hooks wherever it has any (`before_optimizer_step` sees the gradients in `.grad`, as after `backward()`),
the parameters, momentum buffers and `.grad` as the lean loop leaves them after each epoch. What differs: the last
bits (inductor fuses and reorders the kernels), so a compiled run is a different seed-level sample of the same
training, not a rerun of a lean one; two compiled runs on the same machine and thread count are the same to the bit.
The loss must be a function of the parameters, the batch and state fixed for the fit (true of every method here):
inside a scan, a Python value the loss reads is read once per run of batches.

A parameter the loss does not reach keeps `.grad = None` as after `backward()` (so weight decay and momentum leave
it alone): the first step of every fit runs eagerly (it also creates the momentum buffers, as in the lean loop) and
records which parameters got a gradient; the compiled steps differentiate only those. A `local_loss` dynamo cannot
capture in one graph (in-place updates of captured tensors, `.item()`, side effects on Python objects) fails at its
first compiled step with an error that names the method and says to use `local.loop: lean`. Only full batches are
compiled (static batch shapes; an epoch's smaller last batch, or a lone full batch between two smaller ones, runs
eagerly); the graphs are kept per process (the first fit pays the compilation, seconds) and recompiled only when a
method attribute the loss reads as a constant changes.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from flsuite.federation.sgd import is_wrapper_free_sgd

try:  # a prototype API of torch's (torch._higher_order_ops): without it every step is its own compiled call
    from torch._higher_order_ops.scan import scan
except ImportError:  # pragma: no cover - depends on the installed torch
    scan = None

if TYPE_CHECKING:
    from flsuite.methods.base import ClientModule

logger = logging.getLogger(__name__)


class _LocalLoss(nn.Module):
    """The client's `local_loss` as a module's forward, so `torch.func.functional_call` can swap its parameters."""

    def __init__(self, client: ClientModule) -> None:
        super().__init__()
        self.client = client

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.client.local_loss(x, y)


#: What dynamo raises when it cannot capture a loss in one graph.
_CAPTURE_ERRORS = (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


def _loss_grad_and_value(loss_module: _LocalLoss) -> Callable:
    """(params, x, y) → (∇_params loss, loss): the client's loss as a function of the parameters it is given."""

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(loss_module, p, (x, y))

    return torch.func.grad_and_value(loss)


def _loss_and_grads(loss_module: _LocalLoss, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    grads, value = _loss_grad_and_value(loss_module)(params, x, y)
    return value, grads


Layout = tuple[type, tuple[tuple[str, torch.Size, torch.dtype, torch.device], ...]]


class _DropNoCudaRuntime(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


@functools.cache
def _import_cpp_extension_quietly() -> None:
    """Import `torch.utils.cpp_extension` before the process's first compilation, without its CUDA probe's warning.

    Inductor's CPU code generation imports that module (`cpp_builder._get_torch_related_args`, the first time it
    checks the CPU's vector ISA), and its import looks for a CUDA toolkit (`_find_cuda_home`): on a CUDA build of torch
    with `nvcc` or `CUDA_HOME` on a machine without a usable GPU it logs "No CUDA runtime is found, using
    CUDA_HOME=…" once per process, a warning about nothing the CPU compiled loop uses. The module is imported here once
    with that one message filtered from that one logger (`torch.utils.cpp_extension`); the filter is removed right
    after, so everything else the module logs, then or later, still reaches the user."""
    if "torch.utils.cpp_extension" in sys.modules:
        return
    probe, quiet = logging.getLogger("torch.utils.cpp_extension"), _DropNoCudaRuntime()
    probe.addFilter(quiet)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        probe.removeFilter(quiet)


def _copy_of(fn: Callable, layout: Layout, count: int) -> Callable:
    """`fn` compiled as its own function object and code object, named after the client class of `layout`.

    Dynamo keeps its graphs (and counts recompilations against `torch._dynamo.config.recompile_limit`) per code
    object, so each layout gets its own copy of the code: a process that runs several methods or models (a test
    session, an in-process sweep) never exhausts one shared budget, and a fit reuses the graph of the earlier fits
    of its kind."""
    _import_cpp_extension_quietly()
    name = f"{fn.__name__}_{layout[0].__name__}_{count}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)  # new code, same bytecode; dynamo's
    copy = types.FunctionType(code, fn.__globals__, name)  # automatic-dynamic state is keyed by name too
    return torch.compile(copy, fullgraph=True, dynamic=False)


@functools.cache
def compiled_loss_and_grads(layout: Layout) -> Callable:
    """`_loss_and_grads` compiled, one function per client class and parameter layout, kept for the process.
    Static shapes: only full batches are compiled (see CompiledBackward), so a layout needs one graph, plus one per
    value of a constant the loss reads (FedDC's correction switching on after round 1)."""
    return _copy_of(_loss_and_grads, layout, compiled_loss_and_grads.cache_info().currsize)


def _sgd_steps(loss_module: _LocalLoss, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
               offsets: dict[str, torch.Tensor], lr: torch.Tensor, rule: tuple[float, float, float, bool, bool],
               xs: torch.Tensor, ys: torch.Tensor):
    """len(xs) SGD steps, the t-th on batch (xs[t], ys[t]), as one `scan`: each step differentiates the loss at the
    current parameters, adds the method's constant gradient offset o (`ClientModule.gradient_offset`, 0 where it has
    none) and applies torch's SGD rule (torch.optim.SGD's documentation), with the momentum buffers b already created
    (by the fit's first, eager step):

        g = ∇L(θ) + o,  d = ±g + λθ,  b ← μ b + (1 − τ) d,  d ← d + μ b (Nesterov) or b,  θ ← θ − η d

    (rule = (μ, τ, λ, nesterov, maximize); no buffers when μ = 0). Returns the parameters, buffers, the last step's
    g (what `.grad` holds after it) and the t losses."""
    momentum, dampening, weight_decay, nesterov, maximize = rule
    grad_and_value = _loss_grad_and_value(loss_module)

    def step(carry, batch):
        p, b, _ = carry
        grads, value = grad_and_value(p, *batch)
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
        return (new_p, new_b, grads), value

    init = (params, buffers, {n: torch.zeros_like(w) for n, w in params.items()})
    (params, buffers, grads), losses = scan(step, init, (xs, ys))
    return params, buffers, grads, losses


#: Layouts whose `_sgd_steps` dynamo could not capture: their fits step one compiled call per batch.
_UNSCANNED: set[Layout] = set()


@functools.cache
def compiled_sgd_steps(layout: Layout) -> Callable:
    """`_sgd_steps` compiled, one function per client class and parameter layout, kept for the process. The number
    of steps is a dynamic dimension (`mark_dynamic` on the stacked batches): one graph for every run length."""
    return _copy_of(_sgd_steps, layout, compiled_sgd_steps.cache_info().currsize)


def scans_sgd(client: ClientModule, optimizer: torch.optim.Optimizer) -> bool:
    """Whether a fit can run its runs of full batches as one scanned call each: the optimiser is torch's plain SGD
    with nothing around its step (`is_wrapper_free_sgd`, one parameter group) and the method keeps the default
    (empty) `before_optimizer_step` / `after_optimizer_step`, so there is nothing to call between two steps."""
    from flsuite.methods.base import ClientModule

    return (scan is not None and is_wrapper_free_sgd(optimizer) and len(optimizer.param_groups) == 1
            and type(client).before_optimizer_step is ClientModule.before_optimizer_step
            and type(client).after_optimizer_step is ClientModule.after_optimizer_step)


def stacked(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(tensors)` at offset 0 of its storage. Consecutive equal pieces of one contiguous tensor (an
    epoch's batches: `split` views of one gather) are viewed in place instead of copied, if they start it."""
    first = tensors[0]
    size, storage, offset = first.numel(), first.untyped_storage().data_ptr(), first.storage_offset()
    if offset == 0 and all(t.is_contiguous() and t.shape == first.shape and t.storage_offset() == i * size
                           and t.untyped_storage().data_ptr() == storage for i, t in enumerate(tensors)):
        return first.as_strided((len(tensors), *first.shape), (size, *first.stride()), 0)
    return torch.stack(list(tensors))


class CompiledSteps:
    """Per fit: one epoch's steps under `local.loop: compiled`.

    The fit's first step, and any batch smaller than `local.batch_size`, is an eager step of the lean loop. Where
    `scans_sgd` holds, every run of two or more full batches is then one compiled call of `_sgd_steps` (forward,
    backward and update of all its steps in one graph; the parameters, momentum buffers and `.grad` are written back
    after it, as the lean loop leaves them) and a lone full batch an eager step; elsewhere each full batch is one
    compiled forward-and-backward (`CompiledBackward`) between the method's hooks and the optimiser's step."""

    def __init__(self, client: ClientModule, optimizer: torch.optim.Optimizer) -> None:
        self.client, self.optimizer = client, optimizer
        self.backward = CompiledBackward(client)
        self.scans = scans_sgd(client, optimizer)

    @property
    def scanning(self) -> bool:
        """Whether runs of full batches are scanned now: `scans_sgd`, after the first step (which decides the
        parameters the loss reaches: at least one), unless the layout's scan could not be captured."""
        return self.scans and bool(self.backward.reached) and self.backward.layout not in _UNSCANNED

    def epoch(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
              one_step: Callable[[torch.Tensor, torch.Tensor, Callable], torch.Tensor]) -> list[torch.Tensor]:
        """Train on `batches`; `one_step(x, y, backward)` is the lean loop's step with a given backward. Returns the
        losses, in step order, as 1-d tensors."""
        losses, i, full = [], 0, self.backward.full_batch
        while i < len(batches):
            end = i
            if self.scanning:
                while end < len(batches) and len(batches[end][1]) == full:
                    end += 1
            if end - i >= 2:
                scanned = self._scan(batches[i:end])
                if scanned is not None:
                    losses.append(scanned)
                    i = end
                    continue
            # the first step, a smaller batch, or (scanning) a lone full batch: eager, as a graph of its own would
            # cost seconds of compilation for one step; without scanning, a full batch is one compiled call
            backward = self.client.eager_backward if self.scanning else self.backward
            losses.append(one_step(*batches[i], backward).reshape(1))
            i += 1
        return losses

    def _scan(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """The steps on `batches` as one call; None (and this fit, and every later one of its layout, steps one
        compiled call per batch) if dynamo cannot capture the loss inside a scan (e.g. boolean-mask indexing: a
        shape that depends on the data)."""
        reached, state, layout = self.backward.reached, self.optimizer.state, self.backward.layout
        group = self.optimizer.param_groups[0]
        xs, ys = stacked([x for x, _ in batches]), stacked([y for _, y in batches])
        torch._dynamo.mark_dynamic(xs, 0)
        torch._dynamo.mark_dynamic(ys, 0)
        momentum = group["momentum"]
        params = {n: p.detach() for n, p in reached}
        buffers = {n: state[p]["momentum_buffer"] for n, p in reached} if momentum != 0 else {}
        offset_of = dict(self.client.gradient_offset_pairs())
        offsets = {n: offset_of[p] for n, p in reached if p in offset_of}
        rule = (momentum, group["dampening"], group["weight_decay"], group["nesterov"], group["maximize"])
        lr = torch.tensor(group["lr"], dtype=reached[0][1].dtype, device=reached[0][1].device)
        try:
            params, buffers, grads, losses = compiled_sgd_steps(layout)(self.backward.loss_module, params, buffers, offsets, lr, rule, xs, ys)
        except _CAPTURE_ERRORS as e:
            _UNSCANNED.add(layout)
            logger.warning("local.loop: compiled steps %s one batch per compiled call: its local_loss could not be "
                           "scanned over a run of batches (%s: %s)", type(self.client).__name__, type(e).__name__, _first_line(e))
            return None
        with torch.no_grad():
            for n, p in reached:
                p.copy_(params[n])
                p.grad = grads[n]
                if momentum != 0:
                    state[p]["momentum_buffer"].copy_(buffers[n])
        self.client.num_steps += len(batches)
        return losses.detach()


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
        self.layout: Layout | None = None
        self.full_batch = client.local.batch_size

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.compiled is None or len(y) != self.full_batch:
            return self._eager_step(x, y)
        if x.storage_offset() or y.storage_offset():  # batches are views into the epoch's data, and a static graph
            x, y = x.clone(), y.clone()  # is specialised to its inputs' offsets: give it offset 0 every time
        params = {n: p.detach() for n, p in self.reached}
        try:
            loss, grads = self.compiled(self.loss_module, params, x, y)
        except _CAPTURE_ERRORS as e:
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
        self.layout = (type(self.client), tuple((n, p.shape, p.dtype, p.device) for n, p in self.reached))
        self.compiled = compiled_loss_and_grads(self.layout)
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
