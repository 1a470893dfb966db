"""Operations on model weights (state dicts) shared by every aggregation method."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from flsuite.federation.task import ClientResult, Weights


def clone_weights(weights: Mapping[str, torch.Tensor]) -> Weights:
    """A detached CPU copy."""
    return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def weighted_average(weights: Sequence[Mapping[str, torch.Tensor]], coefficients: Sequence[float]) -> Weights:
    """Σ_k c_k w_k / Σ_k c_k for every floating tensor, computed in float64 and cast back.

    Integer buffers (e.g. BatchNorm's `num_batches_tracked`) are not averaged: the first client's value is kept.
    """
    if not weights:
        raise ValueError("weighted_average needs at least one set of weights")
    if len(weights) != len(coefficients):
        raise ValueError(f"{len(weights)} weight sets but {len(coefficients)} coefficients")
    total = float(sum(coefficients))
    if total <= 0:
        raise ValueError(f"aggregation coefficients must sum to a positive number, got {list(coefficients)}")
    out: Weights = {}
    for name, first in weights[0].items():
        if not torch.is_floating_point(first):
            out[name] = first.detach().clone()
            continue
        acc = torch.zeros_like(first, dtype=torch.float64)
        for w, c in zip(weights, coefficients):
            acc += w[name].to(torch.float64) * (float(c) / total)
        out[name] = acc.to(first.dtype)
    return out


def sample_average(results: Sequence[ClientResult]) -> Weights:
    """FedAvg's average of the clients' weights ∝ their sample counts (a method's buffers, whatever its weighting)."""
    return weighted_average([r.weights for r in results], [float(r.num_samples) for r in results])


def num_bytes(obj: Any) -> int:
    """Bytes of tensor data in a (nested) payload: what a real deployment would have to send."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(num_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(num_bytes(v) for v in obj)
    return 0


def digest(weights: Mapping[str, torch.Tensor]) -> str:
    """A content hash of a weights dict (names, dtypes, shapes and values): equal weights, equal digest."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def is_finite(weights: Mapping[str, torch.Tensor]) -> bool:
    """True when no floating tensor holds NaN or Inf. A tensor's sum is finite when every entry is (a NaN or an
    infinity makes it NaN or infinite), so only a tensor whose sum is not (an entry that is not, or an overflow of
    finite entries) is checked entry by entry: one reduction per tensor instead of a boolean copy of it."""
    return all(
        math.isfinite(v.sum().item()) or bool(torch.isfinite(v).all())
        for v in weights.values()
        if torch.is_floating_point(v)
    )


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], names: Sequence[str]) -> float:
    """‖a − b‖₂ over the entries `names`, in float64."""
    return math.sqrt(sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in names))
