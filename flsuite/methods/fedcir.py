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
`flsuite.methods.generators`); then the MLE per class from `mle_samples` draws of G
(eval mode): μ_g(y) = mean z, σ_g(y)² = mean (z − μ_g(y))². Clients download G (if λ_reg > 0) and μ_g, σ_g (if
λ_align > 0); both count in `bytes_down` (Table III). All server draws use the derived server stream.

Deviations (docs/fedcir.md): round 1 runs without both terms (spec §7.4's alternative: the engine has no server stream
before round 1 and the initial heads are untrained; G is created in round 1's server update from that round's stream
and trained on the round-1 heads). With λ_reg = λ_align = 0 no generator is trained or sent: the run is FedAvg exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.server import ServerContext
from flsuite.federation.task import ClientResult, ServerUpdate, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedcir_terms import KL_REDUCTIONS, KLReduction, TermsClient, reduce_kl
from flsuite.methods.generators import (
    Ensemble,
    GeneratorMethod,
    Noise,
    build_generator,
    class_gaussian_mle,
    draw_noise,
    frozen_generator,
    gaussian_kl,
)
from flsuite.models.heads import ModelSpec
from flsuite.models.representation import check_contract

SIGMA_MIN = 1e-6  #: added to softplus for the encoder's σ (spec §7.7)
SIGMA_G_MIN = 1e-3  #: floor of σ_g inside the KL (spec §1.3)


class _Trunk(Protocol):
    """A body whose `features(x)` [batch, width] is the representation: a contract model with its head stripped."""

    def features(self, x: torch.Tensor) -> torch.Tensor: ...


def _has_features(body: nn.Module) -> TypeGuard[_Trunk]:
    return callable(getattr(body, "features", None))


class ProbabilisticModel(Protocol):
    """What FedCiR's L_align and FedSR use of a model: `encode(x) -> (μ, σ)`, `sample(μ, σ) -> z` and the contract's
    linear `head` (`ProbabilisticClassifier`, which `ProbabilisticEncoder` builds, has them)."""

    @property
    def head(self) -> nn.Linear: ...

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def sample(self, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor: ...


def is_probabilistic(model: nn.Module) -> TypeGuard[ProbabilisticModel]:
    return callable(getattr(model, "encode", None)) and callable(getattr(model, "sample", None)) and isinstance(getattr(model, "head", None), nn.Linear)


class ProbabilisticClassifier(nn.Module):
    """body → Linear(width, 2d) → (μ, σ); `features` samples z = μ + σ ⊙ ε in training (stochastic) and is μ otherwise;
    `head` = Linear(d, C). `forward` = head(features) except in eval mode with `eval_samples` > 1: the log of the
    mean softmax over that many draws (a fixed seed per call, so evaluation is deterministic)."""

    def __init__(self, body: nn.Module, width: int, dim: int, num_classes: int, stochastic: bool, eval_samples: int, contract_body: bool) -> None:
        super().__init__()
        self.body, self.stats, self.fc = body, nn.Linear(width, 2 * dim), nn.Linear(dim, num_classes)
        self.stochastic, self.eval_samples, self._contract_body = stochastic, eval_samples, contract_body

    @property
    def head(self) -> nn.Linear:
        return self.fc

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        body = self.body
        if not self._contract_body:
            h = body(x)
        elif _has_features(body):
            h = body.features(x)
        else:
            raise TypeError(f"{type(body).__name__} has no features(x): a contract body is a contract model without its head")
        mu, s = self.stats(h).chunk(2, dim=-1)
        return mu, F.softplus(s) + SIGMA_MIN

    def sample(self, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return mu + sigma * torch.randn_like(mu) if (self.training and self.stochastic) else mu

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.sample(*self.encode(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or not self.stochastic or self.eval_samples <= 1:
            return self.fc(self.features(x))
        mu, sigma = self.encode(x)
        g = torch.Generator(device=mu.device).manual_seed(0)
        draws = [F.softmax(self.fc(mu + sigma * torch.randn(mu.shape, generator=g, device=mu.device, dtype=mu.dtype)), -1) for _ in range(self.eval_samples)]
        return torch.stack(draws).mean(0).log()


def _strip_head(model: nn.Module) -> None:
    """Replace the contract's head module by an identity (its parameters would otherwise train and travel unused)."""
    head = check_contract(model).head
    for name, child in model.named_children():
        if child is head:
            setattr(model, name, nn.Identity())  # nn.Sequential too: its children are registered by name
            return
    raise TypeError(f"{type(model).__name__}: its head is not a direct child module; cannot use it as a probabilistic encoder's body")


class ProbabilisticEncoder(ModelSpec):
    """FedCiR's / FedSR's probabilistic representation (spec §1.1): an MLP over feature vectors, or `backbone`'s
    `features` (e.g. `flsuite.models.backbones.ResNet18`, its own classifier removed) over images, then Linear → (μ, σ).

    Args:
        backbone: A contract model spec whose `features` feed the (μ, σ) layer; null: an MLP over flattened inputs.
        hidden: Hidden widths of that MLP (ReLU after each).
        dim: Representation dimension d (512, spec §3).
        stochastic: Sample z = μ + σ ⊙ ε in training; false: z = μ (a deterministic encoder).
        eval_samples: Test-time draws averaged in softmax space; 1: z = μ (the headline numbers, spec §7.8).
    """

    def __init__(
        self, backbone: ModelSpec | None = None, hidden: Sequence[int] = (512,), dim: int = 512, stochastic: bool = True, eval_samples: int = 1
    ) -> None:
        if dim < 1 or eval_samples < 1:
            raise ValueError(f"{type(self).__name__}: dim and eval_samples must be >= 1, got {dim} and {eval_samples}")
        self.backbone, self.hidden, self.dim = backbone, list(hidden), dim
        self.stochastic, self.eval_samples = stochastic, eval_samples

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if self.backbone is not None:
            body = self.backbone.build(input_shape, num_classes)
            width = check_contract(body).head.in_features
            _strip_head(body)
        else:
            layers: list[nn.Module] = [nn.Flatten()]
            width = math.prod(input_shape)
            for h in self.hidden:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
            body = nn.Sequential(*layers)
        return ProbabilisticClassifier(body, width, self.dim, num_classes, self.stochastic, self.eval_samples, self.backbone is not None)


def require_encoder(model: nn.Module, who: str) -> ProbabilisticModel:
    """`model`, checked to be a probabilistic encoder (a clear error names the class that is not)."""
    if not is_probabilistic(model):
        raise TypeError(
            f"{who} needs a probabilistic encoder (encode/sample and a linear head): use model: flsuite.methods.fedcir.ProbabilisticEncoder, "
            f"not {type(model).__name__}"
        )
    return model


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
            {"gen": frozen_generator(b["generator"], head.out_features, head.in_features, m.noise_dim, m.hidden, self.device)} if "generator" in b else {}
        )
        self._q: tuple[torch.Tensor, torch.Tensor] | None = None  # q(z|y): μ_g [C, d] and σ_g [C, d]
        if "mu_g" in b:
            require_encoder(self.model, "FedCiR's L_align")
            self._q = (b["mu_g"].to(self.device), b["sigma_g"].to(self.device).clamp_min(SIGMA_G_MIN))
        # added align first, then reg: the operations (and bits) of earlier releases
        self.weights = {**({"align": m.lam_align} if self._q is not None else {}), **({"reg": m.lam_reg} if self._frozen else {})}
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
                z_gen = self._frozen["gen"](y_gen, draw_noise(len(y), self.method.noise_dim, self.method.noise, device=y.device))
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
        return FedCiRClientSettings(self.lam_reg, self.lam_align, self.noise_dim, self.hidden, self.noise, self.kl_reduction)

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
            raise ValueError("FedCiR: generator_steps, generator_batch, noise_dim, hidden, mle_samples must be >= 1 and generator_lr > 0")
        if ensemble not in ("logits", "mixture", "per_client"):
            raise ValueError(f"FedCiR ensemble must be 'logits', 'mixture' or 'per_client', got {ensemble!r}")
        if kl_reduction not in KL_REDUCTIONS:
            reduce_kl(torch.zeros(1), kl_reduction)  # raises the one message for a bad reduction
        self.lam_reg, self.lam_align = lam_reg, lam_align
        self.generator_steps, self.generator_batch, self.noise_dim, self.hidden = generator_steps, generator_batch, noise_dim, hidden
        self.generator_lr, self.ensemble, self.mle_samples, self.kl_reduction = generator_lr, ensemble, mle_samples, kl_reduction
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
            mu, sigma = class_gaussian_mle(gen.eval(), self.num_classes, self.mle_samples, self.noise_dim, self.noise, ctx.generator("mle"))
            new.update(mu_g=mu, sigma_g=sigma)
            metrics["sigma_g_mean"] = float(sigma.mean())
        return ServerUpdate(weights, {**server_state, **new}, metrics)


__all__ = ["FedCiR", "FedCiRClient", "ProbabilisticClassifier", "ProbabilisticEncoder"]
