"""What the local loops count in one client fit, handed to the hooks that run after it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class FitStatistics:
    """What the loop counts in one fit (`flsuite.federation.local.loops.ClientFit`), handed to the hooks that run
    after it (`end`, `upload`, `next_state`, `metrics`) and to the result: float64 sums, on the fit's device (no sync
    per step), of the mini-batch losses and of the reported `ClientModule.TASK_LOSS` (None: none reported), and the
    optimiser steps taken."""

    loss_sum: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    task_loss_sum: torch.Tensor | None = None
    num_steps: int = 0

    @property
    def mean_loss(self) -> float:
        """The mean mini-batch loss (float64 sum over steps / steps; 0 steps: 0)."""
        return float(self.loss_sum) / max(self.num_steps, 1)

    @property
    def mean_task_loss(self) -> float:
        """The mean FL-task loss: the reported `TASK_LOSS`, else the mean loss."""
        return self.mean_loss if self.task_loss_sum is None else float(self.task_loss_sum) / max(self.num_steps, 1)

    def add_loss(self, loss: torch.Tensor) -> None:
        """Add a float64 loss (one step's, or a sum of steps in step order), on its device."""
        if self.loss_sum.device != loss.device:
            self.loss_sum = self.loss_sum.to(loss.device)
        self.loss_sum += loss

    def add_task_loss(self, value: torch.Tensor) -> None:
        """Add one step's FL-task loss (float64, on the value's device)."""
        value = value.detach().double()
        self.task_loss_sum = (
            value.clone() if self.task_loss_sum is None else self.task_loss_sum.to(value.device) + value
        )
