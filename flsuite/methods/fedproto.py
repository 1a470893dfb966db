"""FedProto (Tan et al., AAAI 2022, "Federated Prototype Learning across Heterogeneous Clients").

Clients share class prototypes: the mean representation of each class. Local objective on a batch:
    ℓ = CE(f(x), y) + λ · MSE(z, p̄_y)        (over the samples whose class has a global prototype),
with z the representation (the model's `features(x)`, or the logits for the linear-head family, GGEUR spec §8 A18;
see `flsuite.models.representation`). Each client uploads its per-class mean representation p_k,c and count n_k,c,
collected over all of its local steps in the round (as the official code does). The server forms
    p̄_c = Σ_k n_k,c p_k,c / Σ_k n_k,c   (count-weighted)
for the classes seen this round and keeps the previous prototype of classes no sampled client holds.
The model weights are still aggregated by FedAvg, as the GGEUR benchmark does (the original FedProto shares no
weights, for heterogeneous models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from flsuite.federation.fit_statistics import FitStatistics
from flsuite.federation.method import ClientModule
from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.models.representation import ClassSums, forward_with_representation, logits_as_representation


def masked_mse(z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`F.mse_loss(z[mask], target[mask])` without a data-dependent shape: the mean of (z − target)² over the
    elements of the rows where `mask` holds; 0 where no row does."""
    squared = torch.where(mask[:, None], (z - target).pow(2), torch.zeros_like(z))
    return squared.sum() / (mask.sum().clamp(min=1) * z.shape[1])


@dataclass(frozen=True)
class FedProtoClientSettings:
    """What FedProto's clients read (see `FedProto`)."""

    lam: float


class FedProtoClient(ClientModule[FedProtoClientSettings]):
    """CE + λ · MSE to the global prototypes; gathers its own per-class mean representations."""

    def begin(self) -> None:
        self._use_logits = logits_as_representation(self.model)
        protos = self.task.broadcast.get("protos")
        # the global prototypes [C, d] and which classes have one [C], broadcast together (none in round 1)
        self._protos: tuple[torch.Tensor, torch.Tensor] | None = (
            (protos.to(self.device), self.task.broadcast["has"].to(self.device)) if protos is not None else None
        )
        self._sums = ClassSums()  # this fit's per-class representation sums and counts

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits, z = forward_with_representation(self.model, x, self._use_logits)
        ce = F.cross_entropy(logits, y)
        loss = ce
        if self._protos is not None:
            protos, has = self._protos
            loss = loss + self.method.lam * masked_mse(z, protos[y], has[y])
        return loss, {"z": z, "y": y, "logits": logits, self.TASK_LOSS: ce}

    def gather(self, statistics: dict[str, torch.Tensor]) -> None:
        self._sums.add(statistics["z"], statistics["y"], statistics["logits"].shape[1])

    def upload(self, fit: FitStatistics) -> dict:
        if self._sums.counts is None:
            return {}
        return {"protos": self._sums.means().float().cpu(), "counts": self._sums.counts.cpu()}


class FedProto(FedAvg):
    """FedProto: prototype regularisation (λ · MSE to the global class prototypes); weights by FedAvg.

    Args:
        lam: Weight λ of the prototype loss (2.0, GGEUR's benchmark). λ = 0 is FedAvg.
        weighting: Aggregation weights of the model weights, as FedAvg: "samples" or "uniform".
    """

    client_module = FedProtoClient

    def client_settings(self) -> FedProtoClientSettings:
        return FedProtoClientSettings(self.lam)

    def __init__(self, lam: float = 2.0, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        if lam < 0:
            raise ValueError(f"FedProto lam must be >= 0, got {lam}")
        self.lam = lam

    def broadcast(self, round: int, server_state: State) -> dict:
        if "protos" not in server_state:
            return {}
        return {"protos": server_state["protos"], "has": server_state["has"]}

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        weights, _ = super().aggregate(round, global_weights, results, server_state)
        uploads = [r.upload for r in results if "protos" in r.upload]
        if not uploads:
            return weights, server_state
        counts = torch.stack([u["counts"] for u in uploads]).to(torch.float64)  # [K, C]
        sums = sum(u["protos"].to(torch.float64) * c[:, None] for u, c in zip(uploads, counts))
        total = counts.sum(0)
        seen = total > 0
        fresh = sums / total.clamp(min=1)[:, None]
        if "protos" in server_state:
            protos = torch.where(seen[:, None], fresh, server_state["protos"].to(torch.float64))
            has = seen | server_state["has"]
        else:
            protos, has = fresh, seen
        return weights, {**server_state, "protos": protos.float(), "has": has}
