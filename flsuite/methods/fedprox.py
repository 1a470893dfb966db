"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term that keeps local models near the global one.

Local objective on client k in round t:  h_k(w) = F_k(w) + μ/2 ‖w − w^t‖²,  where w^t are the round's global weights.
The server aggregates as FedAvg (∝ client sample count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.method import ClientModule
from flsuite.methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedProxClientSettings:
    """What FedProx's clients read (see `FedProx`)."""

    mu: float


class FedProxClient(ClientModule[FedProxClientSettings]):
    """Cross-entropy plus μ/2‖w − w_global‖² over the trainable parameters."""

    def begin(self) -> None:
        self._anchor = {
            name: self.task.global_weights[name].detach().to(self.device, copy=True)
            for name, p in self.model.named_parameters()
            if p.requires_grad
        }

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ce = F.cross_entropy(self.model(x), y)
        prox = sum((p - self._anchor[n]).pow(2).sum() for n, p in self.model.named_parameters() if n in self._anchor)
        return ce + 0.5 * self.method.mu * prox, {self.TASK_LOSS: ce}


class FedProx(FedAvg):
    """FedProx: local loss F_k(w) + μ/2 ‖w − w_global‖²; FedAvg aggregation.

    Args:
        mu: Proximal coefficient μ. The GGEUR paper gives none; 0.01 (the MarsFL benchmark default) is the suite's
            choice. μ = 0 is FedAvg.
        weighting: Aggregation weights, as FedAvg: "samples" (∝ client sample count) or "uniform".
    """

    client_module = FedProxClient

    def client_settings(self) -> FedProxClientSettings:
        return FedProxClientSettings(self.mu)

    def __init__(self, mu: float = 0.01, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        if mu < 0:
            raise ValueError(f"FedProx mu must be >= 0, got {mu}")
        self.mu = mu
