"""FedProc (Mu et al., FGCS 2023, "Prototypical contrastive federated learning on non-IID data"), as FKPL's and
FPL's benchmark runs it (WenkeHuang/RethinkFL `models/fedproc.py`, the code behind FKPL's baseline numbers).

Client k in round t (of T), with global class prototypes c_j (those of classes some client held last round):
    ℓ = α_t · L_pc + (1 − α_t) · CE(f(x), y),      α_t = 1 − (t − 1)/(T − 1)
    L_pc = (1/B) Σ_{i: c_{y_i} exists} −log( exp(cos(z_i, c_{y_i})/τ) / Σ_j exp(cos(z_i, c_j)/τ) )   (τ = 1)
with z the representation (`features(x)`; the logits for the linear-head family, GGEUR spec §8 A18). The batch mean
divides by every sample B, also those whose class has no prototype (the reference code). Each client uploads the
per-class mean representation over its last local epoch; the server's prototype of class j is the unweighted mean
over the clients that uploaded one; weights are averaged by FedAvg.

Deviation: in round 1 there are no prototypes, and the reference code's loss is then (1 − α_1)·CE = 0 (round 1 trains
nothing); here it is plain CE (FedAvg's round 1). `alpha` fixes α for every round (α = 0 is FedAvg).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule, S
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.models.representation import ClassSums, forward_with_representation, logits_as_representation


def prototype_contrastive_loss(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, has: torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    """L_pc over a batch: cross-entropy of cos(z, c_j)/τ over the classes j with a prototype; mean over all B
    samples."""
    logits = F.cosine_similarity(z[:, None, :], protos[None, :, :], dim=2) / tau  # [B, C]
    logits = logits.masked_fill(~has[None, :], float("-inf"))
    mask = has[y]
    target = torch.where(mask, logits.gather(1, y[:, None]).squeeze(1), torch.zeros_like(mask, dtype=logits.dtype))
    per = torch.logsumexp(logits, dim=1) - target
    return torch.where(mask, per, torch.zeros_like(per)).sum() / len(y)


class LastEpochPrototypes(ClientModule[S]):
    """Accumulates the per-class mean representation over the last local epoch (FedProc and FPL upload it)."""

    def _start_prototypes(self) -> None:
        self._use_logits = logits_as_representation(self.model)
        self._sums = ClassSums()  # the last epoch's per-class representation sums and counts

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        """Sums the representations `z` by label `y` in the last local epoch (`logits` give the class count)."""
        if self.epoch == self.epochs - 1:
            self._sums.add(statistics["z"], statistics["y"], statistics["logits"].shape[1])

    def upload(self, fit: FitStatistics) -> dict:
        if self._sums.counts is None:
            return {}
        return {"protos": self._sums.means().float().cpu(), "has": (self._sums.counts > 0).cpu()}


@dataclass(frozen=True)
class FedProcClientSettings:
    """What FedProc's clients read (see `FedProc`)."""

    tau: float


class FedProcClient(LastEpochPrototypes[FedProcClientSettings]):
    """α_t · prototype-contrastive loss + (1 − α_t) · CE; uploads its last epoch's prototypes."""

    def begin(self) -> None:
        self._start_prototypes()
        b = self.task.broadcast
        # the global prototypes [C, d] and which classes have one [C], broadcast together (none in round 1)
        self._protos: tuple[torch.Tensor, torch.Tensor] | None = (
            (b["protos"].to(self.device), b["has"].to(self.device)) if "protos" in b else None
        )
        self._alpha = float(b.get("alpha", 0.0))

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits, z = forward_with_representation(self.model, x, self._use_logits)
        ce = F.cross_entropy(logits, y)
        statistics = {"z": z, "y": y, "logits": logits, self.TASK_LOSS: ce}
        if self._protos is None:
            return ce, statistics
        protos, has = self._protos
        pc = prototype_contrastive_loss(z, y, protos, has, self.method.tau)
        return self._alpha * pc + (1.0 - self._alpha) * ce, statistics


def mean_prototypes(results: Sequence[ClientResult]) -> dict[str, torch.Tensor] | None:
    """Per class, the unweighted mean of the uploaded client prototypes; `has` marks classes someone uploaded."""
    ups = [r.upload for r in results if "protos" in r.upload]
    if not ups:
        return None
    has = torch.stack([u["has"] for u in ups]).to(torch.float64)  # [K, C]
    sums = sum(u["protos"].to(torch.float64) * h[:, None] for u, h in zip(ups, has))
    total = has.sum(0)
    return {"protos": (sums / total.clamp(min=1)[:, None]).float(), "has": total > 0}


class FedProc(FedAvg):
    """FedProc: prototype-contrastive local loss with a decaying weight; weights by FedAvg.

    Args:
        schedule_rounds: T of α_t = 1 − (t − 1)/(T − 1) (set it to the run's `rounds`).
        alpha: A constant α instead of the schedule (0 = FedAvg); null follows the schedule.
        tau: Temperature of the cosine logits (1: the reference code has none).
        weighting: Aggregation weights as FedAvg: "samples" or "uniform".
    """

    client_module = FedProcClient

    def client_settings(self) -> FedProcClientSettings:
        return FedProcClientSettings(self.tau)

    def __init__(
        self,
        schedule_rounds: int = 100,
        alpha: float | None = None,
        tau: float = 1.0,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(weighting=weighting)
        if schedule_rounds < 2 and alpha is None:
            raise ValueError(
                f"FedProc schedule_rounds must be >= 2 (α_t = 1 − (t−1)/(T−1)), got {schedule_rounds}; or set alpha"
            )
        if alpha is not None and not 0 <= alpha <= 1:
            raise ValueError(f"FedProc alpha must be in [0, 1] or null, got {alpha}")
        if tau <= 0:
            raise ValueError(f"FedProc tau must be > 0, got {tau}")
        self.schedule_rounds, self.alpha, self.tau = schedule_rounds, alpha, tau

    def alpha_at(self, round: int) -> float:
        if self.alpha is not None:
            return self.alpha
        return max(0.0, 1.0 - (round - 1) / (self.schedule_rounds - 1))

    def broadcast(self, round: int, server_state: State) -> dict:
        if "protos" not in server_state:
            return {}
        return {
            "protos": server_state["protos"],
            "has": server_state["has"],
            "alpha": torch.tensor(self.alpha_at(round)),
        }

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        weights, _ = super().aggregate(round, global_weights, results, server_state)
        protos = mean_prototypes(results)
        return weights, ({**server_state, **protos} if protos is not None else server_state)
