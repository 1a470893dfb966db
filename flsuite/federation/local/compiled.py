"""`local.loop: compiled`: the lean loop with its steps compiled, a whole run of batches per call where it can.

The method's own `local_loss` is differentiated once, at trace time (`torch.func.grad_and_value` over the trainable
parameters; the statistics a method returns beside its loss are an auxiliary output, handed to `ClientModule.gather`
after the call in step order), and compiled (`torch.compile`, inductor, `fullgraph=True`), in one of two forms:

- `CompiledSteps` where `scans_sgd` holds (torch's plain SGD, no step hooks; a constant `gradient_offset` is folded
  in): an epoch's consecutive full batches are one `scan` over `_sgd_steps`, gradient and SGD update of every step
  in one graph, compiled once for every run length.
- `CompiledBackward` otherwise: each full batch's forward and backward are one call, the gradients go to `.grad`
  for the method's hooks, and the update is torch's fused SGD or the optimiser's own `step()`.

The same training as the lean loop up to the last bits (inductor reorders kernels): the same batches, update rule
and hooks; the fit's first step and smaller batches run eagerly. Decisions, costs and limits:
docs/performance.md ("local.loop: compiled"). The loss as a function of the parameters, differentiated and compiled
per layout: `flsuite.federation.local.loss_grads`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from flsuite.data.base import StreamedEpoch
from flsuite.federation.local.dynamo import (
    Layout,
    capture_errors,
    first_line,
)
from flsuite.federation.local.loss_grads import _LocalLoss, compiled_loss_and_grads
from flsuite.federation.local.scan_steps import compiled_gathered_sgd_steps, compiled_sgd_steps, scans_sgd, stacked
from flsuite.federation.local.steps import eager_backward, gather, gradient_offset_pairs

if TYPE_CHECKING:
    from flsuite.federation.fit_statistics import FitStatistics
    from flsuite.federation.method import ClientModule

logger = logging.getLogger(__name__)


#: Layouts whose `_sgd_steps` dynamo could not capture: their fits step one compiled call per batch.
_UNSCANNED: set[Layout] = set()


class CompiledSteps:
    """Per fit: one epoch's steps under `local.loop: compiled`.

    The fit's first step, and any batch smaller than `local.batch_size`, is an eager step of the lean loop. Where
    `scans_sgd` holds, every run of two or more full batches is then one compiled call of `_sgd_steps` (forward,
    backward and update of all its steps in one graph; the parameters, momentum buffers and `.grad` are written back
    after it, as the lean loop leaves them) and a lone full batch an eager step; elsewhere each full batch is one
    compiled forward-and-backward (`CompiledBackward`) between the method's hooks and the optimiser's step."""

    def __init__(self, client: ClientModule, fit: FitStatistics, optimizer: torch.optim.Optimizer) -> None:
        self.client, self.fit, self.optimizer = client, fit, optimizer
        self.backward = CompiledBackward(client, fit)
        self.scans = scans_sgd(client, optimizer)

    @property
    def scanning(self) -> bool:
        """Whether runs of full batches are scanned now: `scans_sgd`, after the first step (which decides the
        parameters the loss reaches: at least one), unless the layout's scan could not be captured."""
        return self.scans and bool(self.backward.reached) and self.backward.layout not in _UNSCANNED

    def epoch(
        self,
        batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        one_step: Callable[[torch.Tensor, torch.Tensor, Callable], torch.Tensor],
    ) -> list[torch.Tensor]:
        """Train on `batches` (a list of batches, or a `StreamedEpoch`: its runs of full batches are gathered inside
        the scan, its other batches read one at a time); `one_step(x, y, backward)` is the lean loop's step with a
        given backward. Returns the losses, in step order, as 1-d tensors."""
        if isinstance(batches, StreamedEpoch):
            sizes = [len(rows) for rows in batches.batches]
        else:
            sizes = [len(y) for _, y in batches]
        losses, i, full = [], 0, self.backward.full_batch
        while i < len(batches):
            end = i
            if self.scanning:
                while end < len(batches) and sizes[end] == full:
                    end += 1
            if end - i >= 2:
                scanned = self._scan(batches, i, end)
                if scanned is not None:
                    losses.append(scanned)
                    i = end
                    continue
            # the first step, a smaller batch, or (scanning) a lone full batch: eager, as a graph of its own would
            # cost seconds of compilation for one step; without scanning, a full batch is one compiled call
            backward = functools.partial(eager_backward, self.client, self.fit) if self.scanning else self.backward
            losses.append(one_step(*batches[i], backward).reshape(1))
            i += 1
        return losses

    def _scan(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], start: int, stop: int) -> torch.Tensor | None:
        """The steps on batches[start:stop] as one call; None (and this fit, and every later one of its layout,
        steps one compiled call per batch) if dynamo cannot capture the loss inside a scan (e.g. boolean-mask
        indexing: a shape that depends on the data)."""
        reached, state, layout = self.backward.reached, self.optimizer.state, self.backward.layout
        group = self.optimizer.param_groups[0]
        data: tuple[torch.Tensor, ...]
        if isinstance(batches, StreamedEpoch):  # the rows of each batch; gathered inside the scan
            steps = compiled_gathered_sgd_steps(layout)
            data = (batches.split.x, batches.split.y, torch.stack(list(batches.batches[start:stop])))
        else:
            steps = compiled_sgd_steps(layout)
            data = (stacked([x for x, _ in batches[start:stop]]), stacked([y for _, y in batches[start:stop]]))
        for tensor in data:  # one graph for any run length (and any source size)
            torch._dynamo.mark_dynamic(tensor, 0)
        momentum = group["momentum"]
        params = {n: p.detach() for n, p in reached}
        buffers = {n: state[p]["momentum_buffer"] for n, p in reached} if momentum != 0 else {}
        offset_of = dict(gradient_offset_pairs(self.client))
        offsets = {n: offset_of[p] for n, p in reached if p in offset_of}
        rule = (momentum, group["dampening"], group["weight_decay"], group["nesterov"], group["maximize"])
        lr = torch.tensor(group["lr"], dtype=reached[0][1].dtype, device=reached[0][1].device)
        try:
            params, buffers, grads, losses, statistics = steps(
                self.backward.loss_module, params, buffers, offsets, lr, rule, *data
            )
        except capture_errors() as e:
            _UNSCANNED.add(layout)
            logger.warning(
                "local.loop: compiled steps %s one batch per compiled call: "
                "its local_loss could not be scanned over a run of batches (%s: %s)",
                type(self.client).__name__,
                type(e).__name__,
                first_line(e),
            )
            return None
        with torch.no_grad():
            for n, p in reached:
                p.copy_(params[n])
                p.grad = grads[n]
                if momentum != 0:
                    state[p]["momentum_buffer"].copy_(buffers[n])
        for t in range(stop - start if statistics else 0):
            gather(self.client, self.fit, {k: v[t] for k, v in statistics.items()})
        self.fit.num_steps += stop - start
        return losses.detach()


class CompiledBackward:
    """Per fit: `backward(x, y)` returns the batch loss and leaves the gradients in `.grad`, like
    `loss = client.local_loss(x, y); loss.backward()` (on parameters whose `.grad` was cleared).

    Full batches (`local.batch_size` samples) go through the compiled graph; the fit's first step and any smaller
    batch (an epoch's last) run eagerly, as in the lean loop — the same computation, one static graph."""

    def __init__(self, client: ClientModule, fit: FitStatistics) -> None:
        self.client, self.fit = client, fit
        self.loss_module = _LocalLoss(client)
        self.trainable = [(n, p) for n, p in self.loss_module.named_parameters() if p.requires_grad]
        self.reached: list[tuple[str, nn.Parameter]] = []  # decided by the first (eager) step
        self.compiled: Callable | None = None
        self.layout: Layout = (type(client), ())
        self.full_batch = client.local.batch_size

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.compiled is None or len(y) != self.full_batch:
            return self._eager_step(x, y)
        if x.storage_offset() or y.storage_offset():  # batches are views into the epoch's data, and a static graph
            x, y = x.clone(), y.clone()  # is specialised to its inputs' offsets: give it offset 0 every time
        params = {n: p.detach() for n, p in self.reached}
        try:
            loss, grads, statistics = self.compiled(self.loss_module, params, x, y)
        except capture_errors() as e:
            raise RuntimeError(
                f"local.loop: compiled could not compile {type(self.client).__name__}.local_loss into one graph "
                f"({type(e).__name__}: {first_line(e)}). Use local.loop: lean for this method."
            ) from e
        for n, p in self.reached:
            p.grad = grads[n]
        gather(self.client, self.fit, statistics)
        return loss

    def _eager_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The lean loop's step. The first one of a fit also records which parameters the loss reaches, and the
        optimiser creates its state (momentum buffers) in it exactly as in the lean loop."""
        loss = eager_backward(self.client, self.fit, x, y)
        if self.compiled is not None:
            return loss
        self.reached = [(n, p) for n, p in self.trainable if p.grad is not None]
        self.layout = (type(self.client), tuple((n, p.shape, p.dtype, p.device) for n, p in self.reached))
        self.compiled = compiled_loss_and_grads(self.layout)
        return loss
