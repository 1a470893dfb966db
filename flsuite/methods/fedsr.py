"""FedSR (Nguyen, Torr & Lim, NeurIPS 2022, "FedSR: A Simple and Effective Domain Generalization Method for FL").

A probabilistic representation p(z|x) = N(μ(x), diag σ(x)²) (FedCiR's `ProbabilisticEncoder`, one reparameterised
sample z in training, z = μ at test) and per-class reference Gaussians r(z|y) = N(r_μ(y), diag softplus(r_σ(y))²)
with a learnable scale C, all parameters of the model (averaged by FedAvg, as in the official code). Client loss:
    L = CE(head(z), y) + α_L2R · (1/B) Σ_i ‖z_i‖₂ + α_CMI · (1/B) Σ_i KL(N(C μ(x_i), C² σ(x_i)²) ‖ r(z|y_i)).
The L2R term is the official code's unsquared norm (the paper writes E‖z‖²₂; `l2_squared: true` uses it). The KL is
`flsuite.methods.generators.gaussian_kl` (summed over d, mean over the batch). α_L2R = α_CMI = 0 is FedAvg exactly.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.method import ClientModule
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedcir import ProbabilisticEncoder, require_encoder
from flsuite.methods.generators import gaussian_kl


class FedSRModel(ProbabilisticEncoder):
    """FedCiR's probabilistic encoder plus FedSR's reference Gaussians: `r_mu` [C, d] (zeros), `r_sigma` [C, d]
    (ones, through softplus) and the scalar `C` (one), as model parameters (same arguments as the encoder)."""

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        model = super().build(input_shape, num_classes)
        model.r_mu = nn.Parameter(torch.zeros(num_classes, self.dim))
        model.r_sigma = nn.Parameter(torch.ones(num_classes, self.dim))
        model.C = nn.Parameter(torch.ones(()))
        return model


def reference_gaussians(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`FedSRModel`'s `r_mu` [C, d], `r_sigma` [C, d] (before softplus) and `C` (a clear error without them)."""
    r_mu, r_sigma, scale = getattr(model, "r_mu", None), getattr(model, "r_sigma", None), getattr(model, "C", None)
    if not (isinstance(r_mu, torch.Tensor) and isinstance(r_sigma, torch.Tensor) and isinstance(scale, torch.Tensor)):
        raise TypeError("FedSR's CMI term needs the reference Gaussians: use model: flsuite.methods.fedsr.FedSRModel")
    return r_mu, r_sigma, scale


def check_model(model: nn.Module, cmi: float) -> None:
    require_encoder(model, "FedSR")
    if cmi > 0:
        reference_gaussians(model)


class FedSRClient(ClientModule):
    """CE + α_L2R · L2 norm of z + α_CMI · KL to the reference Gaussian of the label."""

    def begin(self) -> None:
        check_model(self.model, self.method.cmi)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m, model = self.method, require_encoder(self.model, "FedSR")
        mu, sigma = model.encode(x)
        z = model.sample(mu, sigma)
        loss = F.cross_entropy(model.head(z), y)
        if m.l2r > 0:
            norm = z.pow(2).sum(1) if m.l2_squared else z.norm(dim=1)
            loss = loss + m.l2r * norm.mean()
        if m.cmi > 0:
            r_mu, r_sigma, scale = reference_gaussians(self.model)
            sigma_r = F.softplus(r_sigma)[y]
            loss = loss + m.cmi * gaussian_kl(mu * scale, sigma * scale, r_mu[y], sigma_r).mean()
        return loss


class FedSR(FedAvg):
    """FedSR: L2 and conditional-MI regularisers on a probabilistic representation; FedAvg aggregation.

    Args:
        l2r: α_L2R (0.01, the official code's default).
        cmi: α_CMI (5e-4, the official code's default).
        l2_squared: Use ‖z‖² (the paper) instead of ‖z‖ (the official code).
        weighting: FedAvg's weights: "samples" or "uniform".
    """

    client_module = FedSRClient

    def __init__(self, l2r: float = 0.01, cmi: float = 5e-4, l2_squared: bool = False, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        if l2r < 0 or cmi < 0:
            raise ValueError(f"FedSR needs l2r >= 0 and cmi >= 0, got {l2r} and {cmi}")
        self.l2r, self.cmi, self.l2_squared = l2r, cmi, l2_squared

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        check_model(model, self.cmi)  # fail at the start of the run, not inside a client fit
