"""FedCiR (Li et al., IEEE TMC 2024, "Client-Invariant Representation Learning for Federated Non-IID Features").

Model (spec §1.1): a probabilistic encoder p(z|x) = N(μ(x), diag σ(x)²), σ = softplus(·) + 1e-6, and a linear-softmax
classifier p̂(y|z) = softmax(W₂ z + b₂); training uses one reparameterised sample z = μ + σ ⊙ ε (torch's global RNG,
seeded per client task), evaluation z = μ (or the mean softmax of `eval_samples` draws).
Client k's loss on a batch (spec §1.5), with q(z|y) = N(μ_g(y), diag σ_g(y)²) and the broadcast generator G:
    L = (1/B) Σ_i −log p̂(y_i|z_i)
      + λ_reg   · (1/B) Σ_i −log p̂(ỹ_i | G(ỹ_i, ε̃_i)),      ỹ_i ~ U{0..C−1}, ε̃_i ~ N(0, I)   (Eq. 12, L_reg)
      + λ_align · (1/B) Σ_i KL(N(μ(x_i), σ(x_i)²) ‖ N(μ_g(y_i), σ_g(y_i)²))                  (Eq. 14/17, L_align)
G is frozen and in eval mode on the client, so L_reg trains the classifier only; σ_g is clamped ≥ 1e-3;
`kl_reduction: batch_sum` drops L_align's 1/B. Each term's size and loss and gradient shares are logged
(`client/fedcir/*`, `flsuite.methods.fedcir_terms`).
Server (spec §1.6): FedAvg (∝ n_k, BN included); then E_g Adam steps of G on CE(Σ_k α_k h_k(G(y, ε)), y) over every
uploaded head h_k, α_k = n_k / Σ n (`ensemble: logits`; or "mixture", or "per_client" Σ_k α_k CE(h_k(G(y, ε)), y):
`flsuite.methods.generator_model`); then the MLE per class from `mle_samples` draws of G
(eval mode): μ_g(y) = mean z, σ_g(y)² = mean (z − μ_g(y))². Clients download G (if λ_reg > 0) and μ_g, σ_g (if
λ_align > 0); both count in `bytes_down` (Table III). All server draws use the derived server stream.

Deviations (docs/fedcir.md): round 1 runs without both terms (spec §7.4's alternative: the engine has no server stream
before round 1 and the initial heads are untrained; G is created in round 1's server update from that round's stream
and trained on the round-1 heads). With λ_reg = λ_align = 0 no generator is trained or sent: the run is FedAvg exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.server_context import ServerContext
from flsuite.federation.task import ClientResult, ServerUpdate, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedcir_terms import KL_REDUCTIONS, KLReduction, TermsClient, reduce_kl
from flsuite.methods.generator_model import Ensemble, Noise, build_generator, draw_noise, frozen_generator
from flsuite.methods.generators import GeneratorMethod, class_gaussian_mle, gaussian_kl
from flsuite.models.probabilistic import require_encoder
from flsuite.models.representation import check_contract

SIGMA_G_MIN = 1e-3  #: floor of σ_g inside the KL (spec §1.3)


@dataclass(frozen=True)
class FedCiRClientSettings:
    """What FedCiR's clients read (see `FedCiR`)."""

    lam_reg: float
    lam_align: float
    noise_dim: int
    hidden: int
    noise: Noise
    kl_reduction: KLReduction


class FedCiRClient(TermsClient[FedCiRClientSettings]):
    """CE on z = μ + σε, + λ_align · KL to q(z|y), + λ_reg · CE of the local head on generator samples; each term's
    size, loss share and gradient share reported per fit (`flsuite.methods.fedcir_terms`)."""

    def begin(self) -> None:
        b, m = self.task.broadcast, self.method
        head = check_contract(self.model).head
        # in a plain dict, so that Lightning does not see the frozen generator as a submodule
        self._frozen = (
            {
                "gen": frozen_generator(
                    b["generator"], head.out_features, head.in_features, m.noise_dim, m.hidden, self.device
                )
            }
            if "generator" in b
            else {}
        )
        self._q: tuple[torch.Tensor, torch.Tensor] | None = None  # q(z|y): μ_g [C, d] and σ_g [C, d]
        if "mu_g" in b:
            require_encoder(self.model, "FedCiR's L_align")
            self._q = (b["mu_g"].to(self.device), b["sigma_g"].to(self.device).clamp_min(SIGMA_G_MIN))
        # added align first, then reg: the operations (and bits) of earlier releases
        self.weights = {
            **({"align": m.lam_align} if self._q is not None else {}),
            **({"reg": m.lam_reg} if self._frozen else {}),
        }
        self.reports = m.lam_reg > 0 or m.lam_align > 0  # both 0: FedAvg exactly, nothing reported
        self.start_terms()

    def terms(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """The unweighted terms on a batch: "ce" always, "align" and "reg" where on (their draws in this order)."""
        if self._q is None:
            out = {"ce": F.cross_entropy(self.model(x), y)}
        else:
            model = require_encoder(self.model, "FedCiR's L_align")
            mu, sigma = model.encode(x)
            out = {"ce": F.cross_entropy(model.head(model.sample(mu, sigma)), y)}
            out["align"] = reduce_kl(gaussian_kl(mu, sigma, self._q[0][y], self._q[1][y]), self.method.kl_reduction)
        if self._frozen:
            head = check_contract(self.model).head
            y_gen = torch.randint(head.out_features, (len(y),), device=y.device)
            with torch.no_grad():
                z_gen = self._frozen["gen"](
                    y_gen, draw_noise(len(y), self.method.noise_dim, self.method.noise, device=y.device)
                )
            out["reg"] = F.cross_entropy(head(z_gen), y_gen)
        return out


class FedCiR(GeneratorMethod, FedAvg):
    """FedCiR: L_reg through a server-trained generator, L_align to its per-class Gaussians; FedAvg aggregation.

    Args:
        lam_reg: λ_reg (the paper sweeps [0.1, 1.0]; its default is not in the text → 0.5).
        lam_align: λ_align (5e-6, the paper's fixed value).
        kl_reduction: L_align over the batch: "batch_mean" (default; Eq. 14's expectation, spec §7.1) or "batch_sum"
            (B × batch_mean, the scale the paper's λ_align implies; `fedcir_terms.reduce_kl`, docs/fedcir.md).
        generator_steps: E_g, generator steps per round (5).
        generator_batch: Generator batch size B (32).
        noise_dim: Generator noise dimension (32).
        hidden: Generator hidden width (256).
        generator_lr: Adam learning rate of the generator (1e-3).
        ensemble: The generator's target: "logits" (CE of the α-weighted logits: the text's "cross-entropy between the
            ensemble predictions and the labels", spec §7.3; default), "mixture" (−log of the α-weighted
            probabilities) or "per_client" (Σ_k α_k CE_k). With linear heads "logits" is the aggregated head's CE.
        mle_samples: N_s, generator draws per class for μ_g, σ_g (1000).
        weighting: FedAvg's weights ("samples" or "uniform"); also the ensemble's α_k.
    """

    client_module = FedCiRClient

    def client_settings(self) -> FedCiRClientSettings:
        return FedCiRClientSettings(
            self.lam_reg, self.lam_align, self.noise_dim, self.hidden, self.noise, self.kl_reduction
        )

    def __init__(
        self,
        lam_reg: float = 0.5,
        lam_align: float = 5e-6,
        generator_steps: int = 5,
        generator_batch: int = 32,
        noise_dim: int = 32,
        hidden: int = 256,
        generator_lr: float = 1e-3,
        ensemble: Ensemble = "logits",
        mle_samples: int = 1000,
        weighting: Literal["samples", "uniform"] = "samples",
        kl_reduction: KLReduction = "batch_mean",
    ) -> None:
        super().__init__(weighting=weighting)
        if lam_reg < 0 or lam_align < 0:
            raise ValueError(f"FedCiR needs lam_reg >= 0 and lam_align >= 0, got {lam_reg} and {lam_align}")
        if min(generator_steps, generator_batch, noise_dim, hidden, mle_samples) < 1 or generator_lr <= 0:
            raise ValueError(
                "FedCiR: generator_steps, generator_batch, noise_dim, hidden, mle_samples must be >= 1 "
                "and generator_lr > 0"
            )
        if ensemble not in ("logits", "mixture", "per_client"):
            raise ValueError(f"FedCiR ensemble must be 'logits', 'mixture' or 'per_client', got {ensemble!r}")
        if kl_reduction not in KL_REDUCTIONS:
            reduce_kl(torch.zeros(1), kl_reduction)  # raises the one message for a bad reduction
        self.lam_reg, self.lam_align = lam_reg, lam_align
        self.generator_steps, self.generator_batch, self.noise_dim, self.hidden = (
            generator_steps,
            generator_batch,
            noise_dim,
            hidden,
        )
        self.generator_lr, self.ensemble, self.mle_samples, self.kl_reduction = (
            generator_lr,
            ensemble,
            mle_samples,
            kl_reduction,
        )
        self.noise, self.diversity = "normal", 0.0

    def setup(self, model: nn.Module, num_clients: int) -> None:
        super().setup(model, num_clients)
        if self.lam_align > 0:
            require_encoder(model, "FedCiR's L_align (lam_align > 0)")

    def active(self) -> bool:
        return self.lam_reg > 0 or self.lam_align > 0

    def ensemble_coefficients(self, results: Sequence[ClientResult]) -> torch.Tensor:
        """α_k = n_k / Σ n (or uniform, following `weighting`), the same for every label: [K, C]."""
        a = torch.tensor(self.aggregation_coefficients(results), dtype=torch.float32)
        return (a / a.sum())[:, None].expand(-1, self.num_classes)

    def broadcast(self, round: int, server_state: State) -> dict:
        out = {}
        if self.lam_reg > 0 and "generator" in server_state:
            out["generator"] = server_state["generator"]
        if self.lam_align > 0 and "mu_g" in server_state:
            out["mu_g"], out["sigma_g"] = server_state["mu_g"], server_state["sigma_g"]
        return out

    def server_update(self, ctx: ServerContext, weights: Weights, server_state: State) -> ServerUpdate:
        if not self.active():
            return ServerUpdate(weights, server_state)
        new, loss = self.train_generator(ctx, server_state)
        metrics = {"generator_loss": loss}
        if self.lam_align > 0:
            gen = build_generator(self.num_classes, self.dim, self.noise_dim, self.hidden)
            gen.load_state_dict(new["generator"])
            mu, sigma = class_gaussian_mle(
                gen.eval(), self.num_classes, self.mle_samples, self.noise_dim, self.noise, ctx.generator("mle")
            )
            new.update(mu_g=mu, sigma_g=sigma)
            metrics["sigma_g_mean"] = float(sigma.mean())
        return ServerUpdate(weights, {**server_state, **new}, metrics)


__all__ = ["FedCiR", "FedCiRClient"]

#: Moved to `flsuite.models.probabilistic` (FedSR uses it too); configs naming the old class_path keep working.
_MOVED_TO_MODELS = ("ProbabilisticEncoder", "ProbabilisticClassifier")


def __getattr__(name: str) -> object:
    if name in _MOVED_TO_MODELS:
        import warnings

        from flsuite.models import probabilistic

        warnings.warn(
            f"flsuite.methods.fedcir.{name} is now flsuite.models.probabilistic.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(probabilistic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
