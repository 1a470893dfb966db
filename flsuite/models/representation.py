"""The model contract and the helpers that representation-based methods share (MOON, FedNTD, FedProto, FedProc, FPL,
FedGen, FedCiR, FKPL, FedEGG).

Contract: every model a `ModelSpec` builds exposes `features(x) -> [batch, d]` and `head`, its final `nn.Linear`
classifier, with `model(x) == model.head(model.features(x))`. Methods ask the model for its representation through
this contract instead of guessing it from the module tree.
"""

from __future__ import annotations

import copy
from typing import Protocol, cast, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class FeatureModel(Protocol):
    """A classifier split into a representation `features(x)` [batch, d] and its linear `head`."""

    head: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor: ...


def check_contract(model: nn.Module) -> FeatureModel:
    """`model`, checked to follow the contract (a clear error names the class that does not)."""
    if not callable(getattr(model, "features", None)) or not isinstance(getattr(model, "head", None), nn.Linear):
        raise TypeError(
            f"{type(model).__name__} does not follow the model contract: it needs `features(x)` and a `head` that is "
            "an nn.Linear (see flsuite.models.representation); build models with a flsuite ModelSpec"
        )
    return model  # type: ignore[return-value]


def feature_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of `model.features`: every parameter that is not the head's."""
    head = {id(p) for p in check_contract(model).head.parameters()}
    return [p for p in model.parameters() if id(p) not in head]


def logits_as_representation(model: nn.Module) -> bool:
    """True when `features` has no trainable parameters (the linear-head family, GGEUR's "CLIP+MLP"): its output
    is then the fixed input embedding, which no local update can move, so the logits serve as the representation
    (GGEUR spec §8 A18)."""
    return not any(p.requires_grad for p in feature_parameters(model))


def forward_with_representation(
    model: nn.Module, x: torch.Tensor, use_logits: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, representation [batch, d]) of one forward pass: `features(x)` and `head` of it, or the logits twice
    when `use_logits` (see `logits_as_representation`, which also checks the contract once per fit)."""
    split = cast(FeatureModel, model)
    z = split.features(x)
    logits = split.head(z)
    return logits, (logits if use_logits else z)


def frozen_copy(model: nn.Module) -> nn.Module:
    """An eval-mode copy without gradients (a fixed reference model for the round)."""
    other = copy.deepcopy(model).eval()
    for p in other.parameters():
        p.requires_grad_(False)
    return other


class ClassSums:
    """Per-class sums of representations [C, d] (float64) and counts [C] over a fit's batches, allocated at the
    first batch (FedProto's prototypes over every step, FedProc's and FPL's over the last epoch)."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None

    def add(self, z: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
        """Add a batch's representations `z` [B, d] by label `y` [B]."""
        if self.sums is None or self.counts is None:
            self.sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device)
            self.counts = torch.zeros(num_classes, dtype=torch.long, device=z.device)
        self.sums.index_add_(0, y, z.to(torch.float64))
        self.counts += torch.bincount(y, minlength=num_classes)

    def means(self) -> torch.Tensor:
        """The per-class means [C, d] (float64; 0 for a class never seen)."""
        assert self.sums is not None and self.counts is not None, "no batch was added"
        return self.sums / self.counts.clamp(min=1)[:, None]
