"""FedAvg (McMahan et al., 2017): local SGD, then w ← Σ_k (n_k / Σ_j n_j) w_k over the round's clients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from flsuite.federation.method import Method
from flsuite.federation.task import ClientResult


class FedAvg(Method):
    """Federated averaging.

    Args:
        weighting: "samples" weighs each client by its training-set size (the benchmark convention, and the
            default); "uniform" takes a plain mean (the official GGEUR code and FedEGG's Eq. 5).
    """

    def __init__(self, weighting: Literal["samples", "uniform"] = "samples") -> None:
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
        self.weighting = weighting

    def aggregation_coefficients(self, results: Sequence[ClientResult]) -> list[float]:
        if self.weighting == "uniform":
            return [1.0] * len(results)
        return super().aggregation_coefficients(results)
