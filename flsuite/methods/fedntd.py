"""FedNTD (Lee et al., NeurIPS 2022, "Preservation of the Global Knowledge by Not-True Distillation").

Local objective on a batch:   ℓ = CE(f(x), y) + β · τ² · KL( softmax(q̃_g/τ) ‖ softmax(q̃/τ) ),
where q̃ and q̃_g are the local and global logits with the true class's entry removed (the "not-true" classes),
the global model is a frozen copy of the round's starting weights (eval mode), and KL is averaged over the batch.
The server aggregates as FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.method import ClientModule
from flsuite.methods.fedavg import FedAvg
from flsuite.models.representation import frozen_copy


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[batch, C] → [batch, C − 1]: each row without its true class's entry, in class order. A gather of the columns
    j + [j ≥ y] (j < C − 1): shapes that do not depend on the data, so `local.loop: compiled` can scan it; the same
    values and gradients as boolean-mask indexing (a selection: nothing is summed)."""
    columns = torch.arange(logits.shape[1] - 1, device=logits.device).expand(len(y), -1)
    return logits.gather(1, columns + (columns >= y[:, None]))


def ntd_loss(logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """τ² · KL(softmax(global not-true/τ) ‖ softmax(local not-true/τ)), batch mean."""
    local = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    target = F.softmax(not_true_logits(global_logits, y) / tau, dim=1)
    return tau**2 * F.kl_div(local, target, reduction="batchmean")


@dataclass(frozen=True)
class FedNTDClientSettings:
    """What FedNTD's clients read (see `FedNTD`)."""

    tau: float
    beta: float


class FedNTDClient(ClientModule[FedNTDClientSettings]):
    """CE + β · not-true distillation from the frozen global model."""

    def begin(self) -> None:
        self._frozen = {"global": frozen_copy(self.model)}  # a plain dict: not a submodule Lightning would see

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = self.model(x)
        with torch.no_grad():
            global_logits = self._frozen["global"](x)
        ce = F.cross_entropy(logits, y)
        return ce + self.method.beta * ntd_loss(logits, global_logits, y, self.method.tau), {self.TASK_LOSS: ce}


class FedNTD(FedAvg):
    """FedNTD: not-true distillation from the global model; FedAvg aggregation.

    Args:
        tau: Distillation temperature τ (1.0).
        beta: Weight β of the not-true distillation loss (1.0). β = 0 is FedAvg.
        weighting: Aggregation weights, as FedAvg: "samples" or "uniform".
    """

    client_module = FedNTDClient

    def client_settings(self) -> FedNTDClientSettings:
        return FedNTDClientSettings(self.tau, self.beta)

    def __init__(
        self, tau: float = 1.0, beta: float = 1.0, weighting: Literal["samples", "uniform"] = "samples"
    ) -> None:
        super().__init__(weighting=weighting)
        if tau <= 0 or beta < 0:
            raise ValueError(f"FedNTD needs tau > 0 and beta >= 0, got tau={tau}, beta={beta}")
        self.tau, self.beta = tau, beta
