"""FedMix (Yoon, Shin, Hwang & Yang, ICLR 2021, "FedMix: Approximation of Mixup under Mean Augmented Federated
Learning"), and NaiveMix, its direct-mixup baseline, under the paper's MAFL protocol.

MAFL, once before round 1 (`MeanAugmentedRounds`; the exchange: `flsuite.methods.fedmix_means`): client k splits its
training samples (a seeded permutation) into ⌊n_k/M⌋ groups of M = `mix_group` (null: all n_k, one group) and uploads
each group's mean input x̄ and mean one-hot label ȳ; the server pools every client's means (X_g, Y_g) and sends them
to every client. Both ways are client queries, counted in bytes (`query/fedmix/means/bytes_up`,
`query/fedmix/delivery/bytes_down` in the summary); a resumed run neither asks again nor counts twice.

Local loss on a batch (x_i, y_i), i = 1..B, each sample paired with a mean (x̄_i, ȳ_i) drawn uniformly from X_g, Y_g;
ℓ is the cross-entropy, ℓ(f(·), ȳ) = −Σ_c ȳ_c log softmax(f(·))_c, and z_i = (1 − λ) x_i:
    FedMix (the paper's first-order approximation of global mixup ℓ(f((1−λ)x_i + λx̄), (1−λ)y_i + λȳ)):
        L = (1/B) Σ_i [ (1 − λ) ℓ(f(z_i), y_i) + λ ℓ(f(z_i), ȳ_i) + λ (1 − λ) ∂ℓ(f(z_i), y_i)/∂z_i · x̄_i ]
    NaiveMix (mixup with the means themselves):
        L = (1/B) Σ_i [ (1 − λ) ℓ(f(x̃_i), y_i) + λ ℓ(f(x̃_i), ȳ_i) ],   x̃_i = (1 − λ) x_i + λ x̄_i.
λ = 0 is plain cross-entropy (FedAvg's loss). FedAvg aggregation. Images and feature vectors alike (x̄ has x's shape).

Sources and deviations (docs/baselines.md):
- The derivative term: the paper's Taylor term λ ∂ℓ₁/∂x · x̄ of ℓ₁ = (1 − λ) ℓ(f((1 − λ)x), y), hence λ(1 − λ) per
  sample. Its reimplementations (the Flower baseline adap/flower baselines/fedmix, FedBR's LINs-lab/FedBR
  algorithms.py) differentiate the batch-mean loss and average the product again, which makes the term B times
  smaller than the formula; `taylor_norm: batch` reproduces that, the default follows the formula.
- With BatchNorm in training mode a sample's input gradient also carries the other samples' losses (BatchNorm
  couples the batch); ∂/∂z is taken of Σ_i ℓ_i over the batch, as the reimplementations do.
- Pairing: one mean per sample, drawn with torch's seeded stream (the Flower baseline draws one mean per batch).
- `task_loss` (what e.g. FedEGG reads) is ℓ(f(·), y) on the input the method trains on, (1 − λ)x or x̃.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.phases import Phase, Rounds
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedmix_means import OWNER, Delivery, GroupMeans, pool

if TYPE_CHECKING:
    from flsuite.federation.context import RunContext

Variant = Literal["fedmix", "naivemix"]
TaylorNorm = Literal["sample", "batch"]
#: The loss terms logged per round (`client/fedmix/<term>`, unweighted batch means): label CE, mean-label CE, the
#: derivative term.
TERMS = ("ce", "mean_label", "taylor")


def soft_cross_entropy(log_probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """−Σ_c target_c log p_c per sample [B]."""
    return -(target * log_probs).sum(dim=1)


#: A forward's pullback: the cotangent of its output → (the cotangent of its input,).
Pullback = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def forward_with_pullback(model: nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, Pullback]:
    """(model(z), the pullback of that forward to z), differentiable in the parameters, under every local loop (a
    `torch.func.vjp`: the compiled loop differentiates the loss with torch.func, where `autograd.grad` cannot run).
    The buffers (BatchNorm's running statistics) advance once, as in a plain forward: the transformed call updates
    copies, written back after it."""

    def call(z: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        buffers = {name: b.clone() for name, b in model.named_buffers()}
        return torch.func.functional_call(model, buffers, (z,)), buffers

    # (output, pullback, aux), which torch types as a pair; no `cast(tuple[...], ...)` here: dynamo traces this line
    logits, pullback, buffers = torch.func.vjp(call, z, has_aux=True)  # type: ignore[misc]
    if buffers:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    return logits, pullback


def fedmix_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    xbar: torch.Tensor,
    ybar: torch.Tensor,
    lam: float,
    norm: TaylorNorm = "sample",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """FedMix's loss (module docstring) with each sample's partner mean `xbar` [B, ...], `ybar` [B, C]; returns it and
    the batch means of its three terms (unweighted)."""
    logits, pullback = forward_with_pullback(model, (1 - lam) * x)
    log_probs = F.log_softmax(logits, dim=1)
    ce = -log_probs.gather(1, y[:, None]).squeeze(1)
    mean_label = soft_cross_entropy(log_probs, ybar)
    # ∂(Σ_i ℓ(f(z_i), y_i))/∂z through the forward above (∂ℓ/∂logits = softmax − one-hot), itself differentiable in
    # the parameters: the term's gradient is second order.
    (grad,) = pullback(log_probs.exp() - F.one_hot(y, logits.shape[1]).to(logits.dtype))
    taylor = (grad.flatten(1) * xbar.flatten(1)).sum(dim=1)
    scale = lam * (1 - lam) / (len(y) if norm == "batch" else 1)
    loss = ((1 - lam) * ce + lam * mean_label + scale * taylor).mean()
    return loss, {"ce": ce.mean(), "mean_label": mean_label.mean(), "taylor": taylor.mean()}


def naivemix_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, xbar: torch.Tensor, ybar: torch.Tensor, lam: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """NaiveMix's loss (module docstring): mixup of each sample with its partner mean; the loss and its terms."""
    log_probs = F.log_softmax(model((1 - lam) * x + lam * xbar), dim=1)
    ce = -log_probs.gather(1, y[:, None]).squeeze(1)
    mean_label = soft_cross_entropy(log_probs, ybar)
    loss = ((1 - lam) * ce + lam * mean_label).mean()
    return loss, {"ce": ce.mean(), "mean_label": mean_label.mean()}


@dataclass(frozen=True)
class FedMixClientSettings:
    """What FedMix's clients read (see `FedMix`; `means`: the pooled means, set by `with_means`)."""

    lam: float
    variant: Variant
    taylor_norm: TaylorNorm
    means: dict[str, torch.Tensor] | None


class FedMixClient(ClientModule[FedMixClientSettings]):
    """FedMix's or NaiveMix's loss against the pooled means (`method.means`, set by the protocol's exchange)."""

    def begin(self) -> None:
        means = self.method.means
        if means is None:
            raise RuntimeError(
                "FedMix has no global means: they come from its own protocol's exchange "
                "(flsuite.methods.fedmix_means); run it without a `protocol:` in the config"
            )
        self._xbar, self._ybar = means["x"].to(self.device), means["y"].to(self.device)
        self._sums = torch.zeros(len(TERMS), dtype=torch.float64, device=self.device)

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m = self.method
        partner = torch.randint(len(self._ybar), (len(y),), device=self._ybar.device)
        xbar, ybar = self._xbar[partner].to(x.dtype), self._ybar[partner]
        if m.variant == "fedmix":
            loss, terms = fedmix_loss(self.model, x, y, xbar, ybar, m.lam, m.taylor_norm)
        else:
            loss, terms = naivemix_loss(self.model, x, y, xbar, ybar, m.lam)
        return loss, {self.TASK_LOSS: terms["ce"], **{f"term/{k}": v for k, v in terms.items()}}

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        for i, term in enumerate(TERMS):
            if f"term/{term}" in statistics:
                self._sums[i] += statistics[f"term/{term}"].double()

    def metrics(self, fit: FitStatistics) -> dict[str, float]:
        steps = max(fit.num_steps, 1)
        terms = TERMS if self.method.variant == "fedmix" else TERMS[:2]
        return {t: float(self._sums[i]) / steps for i, t in enumerate(TERMS) if t in terms}


class FedMix(FedAvg):
    """FedMix, or NaiveMix, under mean-augmented FL: the clients' group means are pooled and sent once before round
    1; each local loss mixes with them. FedAvg aggregation.

    Args:
        lam: Mixing weight λ ∈ [0, 1) (0.05: the Flower baseline's CIFAR-10 FedMix value; its NaiveMix used 0.1).
            λ = 0 is FedAvg's loss.
        mix_group: Samples per mean, the paper's M_k; null: all of a client's samples, one mean a client (the
            Flower baseline's setting, "all").
        variant: "fedmix" (the first-order approximation) or "naivemix" (direct mixup with the means).
        taylor_norm: "sample" (the formula) or "batch" (the reimplementations' term, B times smaller).
        weighting: FedAvg's weights: "samples" or "uniform".
    """

    client_module = FedMixClient

    def client_settings(self) -> FedMixClientSettings:
        return FedMixClientSettings(self.lam, self.variant, self.taylor_norm, self.means)

    def __init__(
        self,
        lam: float = 0.05,
        mix_group: int | None = None,
        variant: Variant = "fedmix",
        taylor_norm: TaylorNorm = "sample",
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(weighting=weighting)
        if not 0 <= lam < 1:
            raise ValueError(f"FedMix lam must be in [0, 1), got {lam}")
        if mix_group is not None and mix_group < 1:
            raise ValueError(f"FedMix mix_group must be >= 1 or null, got {mix_group}")
        if variant not in ("fedmix", "naivemix") or taylor_norm not in ("sample", "batch"):
            raise ValueError(
                f"FedMix variant must be fedmix|naivemix and taylor_norm sample|batch, got {variant!r}, {taylor_norm!r}"
            )
        self.lam, self.mix_group, self.variant, self.taylor_norm = lam, mix_group, variant, taylor_norm
        #: The pooled means {"x": [G, ...], "y": [G, C]}, set on the copy the exchange makes (`with_means`).
        self.means: dict[str, torch.Tensor] | None = None

    def protocol(self) -> list[Phase]:
        return [MeanAugmentedRounds(self)]

    def with_means(self, means: dict[str, torch.Tensor]) -> FedMix:
        """A copy of this method that carries the pooled means to its clients (in their read-only snapshot)."""
        out = copy.copy(self)
        out.means = means
        return out


class MeanAugmentedRounds(Rounds):
    """FedMix's protocol: the one-shot exchange of `flsuite.methods.fedmix_means` (asked once per run), then the
    round loop with the copy of the method that carries the pooled means (otherwise the default protocol's rounds:
    name "train", plain metric names)."""

    def __init__(self, fedmix: FedMix, name: str = "train") -> None:
        super().__init__(name=name)
        self.fedmix = fedmix

    def run(self, ctx: RunContext) -> None:
        query = GroupMeans(ctx.data.num_classes, self.fedmix.mix_group)
        means = ctx.query_once(OWNER, "means", query, pool).value
        ctx.query_once(OWNER, "delivery", Delivery(), lambda outcome: {}, broadcast=means)
        self.method = self.fedmix.with_means(means)
        super().run(ctx)
