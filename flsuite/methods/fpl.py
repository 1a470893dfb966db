"""FPL (Huang, Ye, Du; CVPR 2023, "Rethinking Federated Learning with Domain Shift: A Prototype View"), as in its
reference code (WenkeHuang/RethinkFL `models/fpl.py`), the baseline of FKPL's tables.

Server, per class j: the clients' local prototypes {p_k^j} are clustered by FINCH (cosine first-neighbour
clustering, the coarsest partition with more than one cluster); the cluster means are the *cluster prototypes*
P^j = {c_1^j, …} and their mean is the *unbiased prototype* u^j. A class uploaded by a single client has P^j = {p^j}.
Client, per sample i whose class y has prototypes (z_i its representation, N = every cluster prototype of every class):
    L_CPCL,i = −log( Σ_{c∈P^y} exp(cos(z_i, c)/τ) / Σ_{c∈N} exp(cos(z_i, c)/τ) )
    L_UPCL,i = (1/d) ‖z_i − u^y‖²                                    (the code's MSE: "+ MSE")
    ℓ = CE(f(x), y) + (1/B) Σ_i (L_CPCL,i + L_UPCL,i)               (B counts every sample, as the code does)
Each client uploads its per-class mean representation over its last local epoch; weights are averaged by FedAvg.
Round 1 has no prototypes: FedAvg's round 1. τ = 0.02 (the paper; the code's default is 0.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import csr_matrix, identity
from scipy.sparse.csgraph import connected_components

from flsuite.federation.task import ClientResult, State, Weights
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.fedproc import LastEpochPrototypes
from flsuite.models.representation import forward_with_representation


def first_neighbour_partition(x: np.ndarray) -> np.ndarray:
    """FINCH's step: link every point to its cosine-nearest neighbour; clusters are the connected components of
    A·Aᵀ with A = (first-neighbour graph + I), i.e. i~j when one is the other's neighbour or they share one."""
    n = len(x)
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    nn = sim.argmax(axis=1)
    a = csr_matrix((np.ones(n), (np.arange(n), nn)), shape=(n, n)) + identity(n, format="csr")
    return connected_components(a @ a.T, directed=False)[1].astype(np.int64)


def finch(x: np.ndarray) -> np.ndarray:
    """FINCH (Sarfraz et al., CVPR 2019) labels as FPL uses them: the first partition, then partitions of the cluster
    means (of the original points) while they reduce the count without collapsing to one cluster; the last kept."""
    labels = first_neighbour_partition(x)
    while labels.max() + 1 > 1:
        k = int(labels.max()) + 1
        means = np.stack([x[labels == c].mean(axis=0) for c in range(k)])
        merged = first_neighbour_partition(means)[labels]
        if merged.max() + 1 == 1 or merged.max() + 1 >= k:
            break
        labels = merged
    return labels


def cluster_prototypes(results: Sequence[ClientResult]) -> dict[str, torch.Tensor] | None:
    """Per class: cluster prototypes [C, Kmax, d] with their mask, and the unbiased prototype [C, d]."""
    ups = [r.upload for r in results if "protos" in r.upload]
    if not ups:
        return None
    num_classes, dim = ups[0]["protos"].shape
    per_class: list[np.ndarray] = []
    for j in range(num_classes):
        held = (
            np.stack([u["protos"][j].double().numpy() for u in ups if bool(u["has"][j])])
            if any(bool(u["has"][j]) for u in ups)
            else np.zeros((0, dim))
        )
        if len(held) > 1:
            labels = finch(held)
            held = np.stack([held[labels == c].mean(axis=0) for c in range(labels.max() + 1)])
        per_class.append(held)
    kmax = max(1, max(len(p) for p in per_class))
    protos = torch.zeros(num_classes, kmax, dim)
    mask = torch.zeros(num_classes, kmax, dtype=torch.bool)
    for j, p in enumerate(per_class):
        protos[j, : len(p)] = torch.from_numpy(p).float()
        mask[j, : len(p)] = True
    unbiased = torch.stack(
        [torch.from_numpy(p.mean(axis=0)).float() if len(p) else torch.zeros(dim) for p in per_class]
    )
    return {"protos": protos, "mask": mask, "unbiased": unbiased, "has": mask.any(dim=1)}


def fpl_loss(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, mask: torch.Tensor, unbiased: torch.Tensor, tau: float
) -> torch.Tensor:
    """(1/B) Σ_i (L_CPCL,i + L_UPCL,i) over the samples whose class has prototypes (see the module docstring)."""
    cos = F.cosine_similarity(z[:, None, None, :], protos[None], dim=3) / tau  # [B, C, K]
    cos = cos.masked_fill(~mask[None], float("-inf"))
    everything = torch.logsumexp(cos.flatten(1), dim=1)
    has = mask.any(dim=1)[y]
    own = torch.where(
        has[:, None], cos[torch.arange(len(y)), y], torch.zeros_like(cos[:, 0])
    )  # no -inf rows: no NaN gradient
    positive = torch.logsumexp(own, dim=1)
    mse = (z - unbiased[y]).pow(2).mean(dim=1)
    per = torch.where(has, everything - positive + mse, torch.zeros_like(mse))
    return per.sum() / len(y)


@dataclass(frozen=True)
class FPLClientSettings:
    """What FPL's clients read (see `FPL`)."""

    tau: float


class FPLClient(LastEpochPrototypes[FPLClientSettings]):
    """CE + FPL's cluster and unbiased prototype loss; uploads its last epoch's prototypes."""

    def begin(self) -> None:
        self._start_prototypes()
        b = self.task.broadcast
        self._p = {k: b[k].to(self.device) for k in ("protos", "mask", "unbiased")} if "protos" in b else None

    def local_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits, z = forward_with_representation(self.model, x, self._use_logits)
        ce = F.cross_entropy(logits, y)
        loss = (
            ce
            if self._p is None
            else ce + fpl_loss(z, y, self._p["protos"], self._p["mask"], self._p["unbiased"], self.method.tau)
        )
        return loss, {"z": z, "y": y, "logits": logits, self.TASK_LOSS: ce}


class FPL(FedAvg):
    """FPL: cluster and unbiased prototype contrastive learning; weights by FedAvg.

    Args:
        tau: InfoNCE temperature τ (0.02, the paper).
        weighting: Aggregation weights as FedAvg: "samples" or "uniform".
    """

    client_module = FPLClient

    def client_settings(self) -> FPLClientSettings:
        return FPLClientSettings(self.tau)

    def __init__(self, tau: float = 0.02, weighting: Literal["samples", "uniform"] = "samples") -> None:
        super().__init__(weighting=weighting)
        if tau <= 0:
            raise ValueError(f"FPL tau must be > 0, got {tau}")
        self.tau = tau

    def broadcast(self, round: int, server_state: State) -> dict:
        return {k: server_state[k] for k in ("protos", "mask", "unbiased")} if "protos" in server_state else {}

    def aggregate(
        self, round: int, global_weights: Weights, results: Sequence[ClientResult], server_state: State, ctx=None
    ) -> tuple[Weights, State]:
        weights, _ = super().aggregate(round, global_weights, results, server_state)
        protos = cluster_prototypes(results)
        return weights, ({**server_state, **protos} if protos is not None else server_state)
