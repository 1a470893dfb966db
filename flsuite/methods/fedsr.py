"""FedSR (Nguyen, Torr & Lim, NeurIPS 2022, "FedSR: A Simple and Effective Domain Generalization Method for FL").

A probabilistic representation p(z|x) = N(μ(x), diag σ(x)²) (FedCiR's `ProbabilisticEncoder`, one reparameterised
sample z in training) and per-class reference Gaussians r(z|y) = N(r_μ(y), diag softplus(r_σ(y))²) with a learnable
scale C. Client loss:
    L = CE(head(z), y) + α_L2R · (1/B) Σ_i ‖z_i‖₂ + α_CMI · (1/B) Σ_i KL(N(C μ(x_i), C² σ(x_i)²) ‖ r(z|y_i)).
The L2R term is the official code's unsquared norm (the paper writes E‖z‖²₂; `l2_squared: true` uses it). The KL is
`flsuite.methods.generators.gaussian_kl` (summed over d, mean over the batch). α_L2R = α_CMI = 0 is FedAvg exactly.

Decisions, from the official code (github.com/atuannguyen/FedSR, src/):
- r_μ, r_σ and C are each client's own (`reference: per_client`, the default): `methods/FedSR.py` `Model.__init__`
  registers them on the `Model`, outside `self.model = Sequential(net, cls)`, and `methods/base.py`
  `Base.communicate` averages `self.model.state_dict()` only. Here they are kept on the client
  (`FedSR.kept_on_client`: the engine carries them neither way) and live in the client's state; the global weights
  keep W₀'s values (unused by the forward). `reference: averaged` is FL-bench's form (`src/server/fedsr.py`
  `FedSRModel`: model parameters, averaged with the weights and sent both ways).
- Aggregation is uniform (`weighting: uniform`, the default): `Base.communicate` takes `sum(ps) / len(ps)`.
- Test: the log of the mean softmax probabilities (not logits) over 20 draws of z (`Base.forward`'s eval branch,
  `--num_samples 20` in `argument.py`): `FedSRModel(eval_samples=20)`, the encoder's own MC evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.generators import gaussian_kl
from flsuite.models.heads import ModelSpec
from flsuite.models.probabilistic import ProbabilisticEncoder, require_encoder

#: The state-dict names of `FedSRModel`'s reference Gaussians and scale (a client's own under `per_client`).
REFERENCE = ("r_mu", "r_sigma", "C")


class FedSRModel(ProbabilisticEncoder):
    """FedCiR's probabilistic encoder plus FedSR's reference Gaussians: `r_mu` [C, d] (zeros), `r_sigma` [C, d]
    (ones, through softplus) and the scalar `C` (one), as model parameters. Same arguments as the encoder, but
    `eval_samples` defaults to 20, the official test-time average (1: z = μ)."""

    def __init__(
        self,
        backbone: ModelSpec | None = None,
        hidden: Sequence[int] = (512,),
        dim: int = 512,
        stochastic: bool = True,
        eval_samples: int = 20,
    ) -> None:
        super().__init__(backbone=backbone, hidden=hidden, dim=dim, stochastic=stochastic, eval_samples=eval_samples)

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


def own_reference(weights: Weights) -> Weights:
    """The `REFERENCE` entries of `weights` (detached CPU copies)."""
    return {k: weights[k].detach().to("cpu", copy=True) for k in REFERENCE if k in weights}


@dataclass(frozen=True)
class FedSRClientSettings:
    """What FedSR's clients read (see `FedSR`)."""

    l2r: float
    cmi: float
    l2_squared: bool
    reference: Literal["per_client", "averaged"]


class FedSRClient(ClientModule[FedSRClientSettings]):
    """CE + α_L2R · L2 norm of z + α_CMI · KL to the reference Gaussian of the label; under `per_client` it trains
    its own r_μ, r_σ, C (from its state; a task without one keeps the model's) and keeps them out of the upload."""

    def begin(self) -> None:
        check_model(self.model, self.method.cmi)
        own = self.task.state.get("reference") if self.method.reference == "per_client" else None
        if own:
            with torch.no_grad():
                for k, v in own.items():
                    getattr(self.model, k).copy_(v)  # in place: the optimiser holds these parameters

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m, model = self.method, require_encoder(self.model, "FedSR")
        mu, sigma = model.encode(x)
        z = model.sample(mu, sigma)
        ce = F.cross_entropy(model.head(z), y)
        loss = ce
        if m.l2r > 0:
            norm = z.pow(2).sum(1) if m.l2_squared else z.norm(dim=1)
            loss = loss + m.l2r * norm.mean()
        if m.cmi > 0:
            r_mu, r_sigma, scale = reference_gaussians(self.model)
            sigma_r = F.softplus(r_sigma)[y]
            loss = loss + m.cmi * gaussian_kl(mu * scale, sigma * scale, r_mu[y], sigma_r).mean()
        return loss, {self.TASK_LOSS: ce}

    def next_state(self, fit: FitStatistics) -> State:
        return (
            {"reference": own_reference(self.model.state_dict())}
            if self.method.reference == "per_client"
            else self.task.state
        )


class FedSR(FedAvg):
    """FedSR: L2 and conditional-MI regularisers on a probabilistic representation; FedAvg aggregation.

    Args:
        l2r: α_L2R (0.01, the official code's default).
        cmi: α_CMI (5e-4, the official code's default).
        l2_squared: Use ‖z‖² (the paper) instead of ‖z‖ (the official code).
        reference: "per_client" (the official code: each client keeps its r_μ, r_σ, C) or "averaged" (FL-bench:
            averaged with the weights by `weighting` and broadcast).
        weighting: FedAvg's weights: "uniform" (the official code's plain mean) or "samples".
    """

    client_module = FedSRClient

    def client_settings(self) -> FedSRClientSettings:
        return FedSRClientSettings(self.l2r, self.cmi, self.l2_squared, self.reference)

    def __init__(
        self,
        l2r: float = 0.01,
        cmi: float = 5e-4,
        l2_squared: bool = False,
        reference: Literal["per_client", "averaged"] = "per_client",
        weighting: Literal["samples", "uniform"] = "uniform",
    ) -> None:
        super().__init__(weighting=weighting)
        if l2r < 0 or cmi < 0:
            raise ValueError(f"FedSR needs l2r >= 0 and cmi >= 0, got {l2r} and {cmi}")
        if reference not in ("per_client", "averaged"):
            raise ValueError(f"FedSR reference must be 'per_client' or 'averaged', got {reference!r}")
        self.l2r, self.cmi, self.l2_squared, self.reference = l2r, cmi, l2_squared, reference

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        check_model(model, self.cmi)  # fail at the start of the run, not inside a client fit

    def init_client_state(self, client_id: int, global_weights: Weights) -> State:
        return {"reference": own_reference(global_weights)} if self.reference == "per_client" else {}

    def aggregate(
        self,
        round: int,
        global_weights: Weights,
        results: Sequence[ClientResult],
        server_state: State,
        ctx: ServerContext | None = None,
    ) -> tuple[Weights, State]:
        """FedAvg; under `per_client` the global weights keep W₀'s reference entries (no client sent its own)."""
        weights, state = super().aggregate(round, global_weights, results, server_state, ctx)
        if self.reference == "per_client":
            weights = {**weights, **own_reference(global_weights)}
        return weights, state

    def kept_on_client(self) -> frozenset[str]:
        """Under `per_client` the reference Gaussians never leave a client (neither way, nor in the byte counts)."""
        return frozenset(REFERENCE) if self.reference == "per_client" else frozenset()
