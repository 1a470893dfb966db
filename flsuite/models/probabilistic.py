"""A probabilistic encoder: z ~ N(μ(x), σ(x)²) before a linear head (FedCiR's encoder, FedSR's representation).
`ProbabilisticEncoder` builds it from any contract model (its head stripped) or an MLP; `require_encoder` checks a
model is one, with an error that names the class that is not."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.models.heads import ModelSpec
from flsuite.models.representation import check_contract

SIGMA_MIN = 1e-6  #: added to softplus for the encoder's σ (spec §7.7)


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
    return (
        callable(getattr(model, "encode", None))
        and callable(getattr(model, "sample", None))
        and isinstance(getattr(model, "head", None), nn.Linear)
    )


class ProbabilisticClassifier(nn.Module):
    """body → Linear(width, 2d) → (μ, σ); `features` samples z = μ + σ ⊙ ε in training (stochastic) and is μ otherwise;
    `head` = Linear(d, C). `forward` = head(features) except in eval mode with `eval_samples` > 1: the log of the
    mean softmax over that many draws (a fixed seed per call, so evaluation is deterministic)."""

    def __init__(
        self,
        body: nn.Module,
        width: int,
        dim: int,
        num_classes: int,
        stochastic: bool,
        eval_samples: int,
        contract_body: bool,
    ) -> None:
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
            raise TypeError(
                f"{type(body).__name__} has no features(x): a contract body is a contract model without its head"
            )
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
        draws = [
            F.softmax(self.fc(mu + sigma * torch.randn(mu.shape, generator=g, device=mu.device, dtype=mu.dtype)), -1)
            for _ in range(self.eval_samples)
        ]
        return torch.stack(draws).mean(0).log()


def _strip_head(model: nn.Module) -> None:
    """Replace the contract's head module by an identity (its parameters would otherwise train and travel unused)."""
    head = check_contract(model).head
    for name, child in model.named_children():
        if child is head:
            setattr(model, name, nn.Identity())  # nn.Sequential too: its children are registered by name
            return
    raise TypeError(
        f"{type(model).__name__}: its head is not a direct child module; "
        "cannot use it as a probabilistic encoder's body"
    )


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
        self,
        backbone: ModelSpec | None = None,
        hidden: Sequence[int] = (512,),
        dim: int = 512,
        stochastic: bool = True,
        eval_samples: int = 1,
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
        return ProbabilisticClassifier(
            body, width, self.dim, num_classes, self.stochastic, self.eval_samples, self.backbone is not None
        )


def require_encoder(model: nn.Module, who: str) -> ProbabilisticModel:
    """`model`, checked to be a probabilistic encoder (a clear error names the class that is not)."""
    if not is_probabilistic(model):
        raise TypeError(
            f"{who} needs a probabilistic encoder (encode/sample and a linear head): "
            f"use model: flsuite.models.probabilistic.ProbabilisticEncoder, not {type(model).__name__}"
        )
    return model
