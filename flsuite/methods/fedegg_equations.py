"""FedEGG's equations: τ from mean features (Eqs. 2-3; `TauQuery` on a client), loss momentum, gate, update ratio."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from flsuite.data.base import ClientData
from flsuite.federation.query import ClientQuery, QueryTask
from flsuite.federation.task import Weights
from flsuite.federation.weights import distance
from flsuite.models.representation import check_contract

CHUNK = 1024  # rows per forward pass when averaging features or losses


def mean_feature(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """mean_x f^l(W; x) in float64, computed in chunks (the model's `features`)."""
    features = check_contract(model).features
    model.eval()
    with torch.no_grad():
        total = sum(features(part).to(torch.float64).sum(0) for part in x.split(CHUNK))
    if not isinstance(total, torch.Tensor):  # the sum's start, 0: no chunks
        raise ValueError("mean_feature needs at least one row")
    return total / len(x)


def log2_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    """log₂ cos(a, b), cos clamped to ≥ 1e-8 (A2)."""
    cos = F.cosine_similarity(a.to(torch.float64), b.to(torch.float64), dim=0)
    return math.log2(max(float(cos), 1e-8))


def threshold(tau_k: list[float], rho: float, iota: float) -> float:
    """Eq. 3: τ = ρ · mean_k τ_k + ι."""
    return rho * sum(tau_k) / len(tau_k) + iota


def llr(loss_c: float, loss_g: float) -> float:
    """The log-loss ratio log₂(L^c / L^g) of Eq. 8; both losses cross-entropies, so positive and finite unless a
    run has diverged or fits its data exactly, which is refused with the values (log₂ is undefined there)."""
    if not (math.isfinite(loss_c) and math.isfinite(loss_g) and loss_c > 0 and loss_g > 0):
        raise ValueError(
            "FedEGG's gate needs positive, finite losses for log2(L^c / L^g); "
            f"got L^c = {loss_c!r} (the clients' FL-task cross-entropy, momentum-averaged) "
            f"and L^g = {loss_g!r} (the guiding loss)"
        )
    return math.log2(loss_c / loss_g)


def gate_open(loss_c: float, loss_g: float, tau: float) -> bool:
    """Eq. 8: guide iff log₂(L^c / L^g) < τ."""
    return llr(loss_c, loss_g) < tau


def momentum_loss(previous: float | None, round_losses: list[float], beta: float) -> float:
    """Eq. 6: L^c ← β L^c + (1 − β) mean_k L_k; the first round starts L^c at the mean (no zero bias, A4)."""
    mean = sum(round_losses) / len(round_losses)
    return mean if previous is None else beta * previous + (1 - beta) * mean


class TauQuery(ClientQuery):
    """Eq. 2 on the client under W₀: uploads τ_k (form "eq3") or its mean feature (form "remark")."""

    name = "fedegg/tau"

    def __init__(self, form: Literal["eq3", "remark"] = "eq3") -> None:
        self.form = form

    def compute(self, client: ClientData, task: QueryTask, model: nn.Module | None) -> dict:
        assert model is not None, "the τ query needs the initial weights"
        mean = mean_feature(model, client.train.x)
        if self.form == "remark":
            return {"mean_feature": mean.to(torch.float32)}
        return {"tau_k": torch.tensor(log2_cos(mean, task.broadcast["guide_mean"]), dtype=torch.float64)}


def update_ratio(start: Weights | None, aggregated: Weights, guided: Weights, model: nn.Module) -> float:
    """‖W_t − W̄_t‖ / ‖W̄_t − W_{t−1}‖ over the model's parameters: the guiding update's size relative to the round's
    aggregated update (inf when the aggregate did not move)."""
    if start is None:
        raise ValueError("FedEGG's update_ratio needs the round's starting weights (ServerContext.start_weights)")
    names = [n for n, _ in model.named_parameters()]
    guiding, aggregate = distance(guided, aggregated, names), distance(aggregated, start, names)
    return guiding / aggregate if aggregate > 0 else (math.inf if guiding > 0 else 0.0)
