"""FKPL Stage 0: one-shot subspace-based client clustering (spec §1.2, following PACFL).

Client m uploads U_m ∈ R^{d_x × p}: the p leading left singular vectors of its data matrix X_m (one column per
training sample, inputs flattened as the federation sees them). The server computes the minimum principal angle
between every pair,
    exact (default):   θ1(U_i, U_j) = arccos(clip(σ_max(U_iᵀ U_j), −1, 1)) · 180/π
    "pacfl" (flag):    θ1(U_i, U_j) = min_{a,b} arccos(clip((U_iᵀ U_j)_ab, −1, 1)) · 180/π   (PACFL's code: entrywise, no |·|)
and clusters the clients with scikit-learn's average-linkage `AgglomerativeClustering` on the precomputed angle matrix
at a distance threshold in degrees (the threshold fixes V). Only U_m leaves a client (d_x·p scalars, Table 9).

Per-class variant (PACFL, `per_class: true`): the budget p is split over the client's classes (⌊p/|K_m|⌋ ≥ 1 each)
and the per-class bases are stacked; the exact θ1 orthonormalises the stacked basis first (QR: the same span), the
PACFL variant uses it as uploaded, as PACFL does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from flsuite.federation.query import ClientQuery, QueryTask

Angle = Literal["exact", "pacfl"]


def subspace_basis(x: torch.Tensor, p: int) -> torch.Tensor:
    """The p leading left singular vectors of X = xᵀ ([d_x, n], one column per sample), float32 [d_x, min(p, rank)].

    Signs are made deterministic (largest-magnitude entry of each vector positive) so that the PACFL variant, which
    is sign-sensitive, does not depend on the LAPACK build."""
    mat = x.reshape(len(x), -1).to(torch.float64).T
    u, s, _ = torch.linalg.svd(mat, full_matrices=False)
    k = min(p, int((s > s.max() * 1e-12).sum()) if len(s) else 0) or 1
    u = u[:, :k]
    idx = u.abs().argmax(dim=0)
    signs = torch.sign(u[idx, torch.arange(k)])
    return (u * torch.where(signs == 0, torch.ones_like(signs), signs)).float()


class SubspaceBasis(ClientQuery):
    """Client side of Stage 0: upload the truncated-SVD basis of the client's training inputs (only U_m)."""

    name = "fkpl/subspace"

    def __init__(self, p: int = 10, per_class: bool = False) -> None:
        self.p, self.per_class = p, per_class

    def compute(self, client, task: QueryTask, model) -> dict[str, Any]:
        x, y = client.train.x, client.train.y
        if not self.per_class:
            return {"basis": subspace_basis(x, self.p)}
        classes = torch.unique(y)
        per = max(1, self.p // len(classes))
        return {"basis": torch.cat([subspace_basis(x[y == k], per) for k in classes], dim=1)}


def principal_angle(u: torch.Tensor, v: torch.Tensor, angle: Angle = "exact") -> float:
    """θ1 between span(u) and span(v) in degrees (see the module docstring for the two definitions)."""
    u, v = u.to(torch.float64), v.to(torch.float64)
    if angle == "pacfl":
        return float(torch.rad2deg(torch.arccos(torch.clamp(u.T @ v, -1.0, 1.0))).min())
    if angle != "exact":
        raise ValueError(f"angle must be 'exact' or 'pacfl', got {angle!r}")
    qu, qv = torch.linalg.qr(u)[0], torch.linalg.qr(v)[0]
    sigma = torch.linalg.svdvals(qu.T @ qv).max()
    return float(torch.rad2deg(torch.arccos(torch.clamp(sigma, -1.0, 1.0))))


def angle_matrix(bases: Sequence[torch.Tensor], angle: Angle = "exact") -> np.ndarray:
    """A_ij = θ1(U_i, U_j) in degrees, symmetric with a zero diagonal."""
    m = len(bases)
    out = np.zeros((m, m), dtype=np.float64)
    for i in range(m):
        for j in range(i + 1, m):
            out[i, j] = out[j, i] = principal_angle(bases[i], bases[j], angle)
    return out


def cluster(angles: np.ndarray, threshold: float) -> list[int]:
    """Cluster labels from average-linkage agglomerative clustering at `threshold` degrees (scikit-learn: pairs whose
    linkage distance is below the threshold merge), relabelled in order of first appearance (client 0 is in 0)."""
    m = len(angles)
    if m == 1:
        return [0]
    raw = AgglomerativeClustering(n_clusters=None, metric="precomputed", linkage="average", distance_threshold=threshold).fit_predict(angles)
    order: dict[int, int] = {}
    return [order.setdefault(int(c), len(order)) for c in raw]


def members(labels: Sequence[int]) -> list[list[int]]:
    """Clusters as sorted client lists, cluster v at index v."""
    return [[k for k, c in enumerate(labels) if c == v] for v in range(max(labels) + 1)]


def purity(labels: Sequence[int], domains: Sequence[str]) -> float:
    """(1/M) Σ_v max_d |C_v ∩ D_d|: 1.0 when no cluster mixes true domains."""
    total = 0
    for group in members(labels):
        _, counts = np.unique([domains[k] for k in group], return_counts=True)
        total += int(counts.max())
    return total / len(labels)


def threshold_scan(angles: np.ndarray, domains: Sequence[str], thresholds: Sequence[float]) -> list[dict[str, float]]:
    """Threshold → number of clusters V → purity, for the clustering study (cheap: the angles are already known)."""
    rows = []
    for t in thresholds:
        labels = cluster(angles, float(t))
        rows.append({"threshold": float(t), "num_clusters": max(labels) + 1, "purity": purity(labels, domains)})
    return rows


def default_scan(angles: np.ndarray, threshold: float) -> list[float]:
    """The configured threshold plus a grid from 0 to just above the largest angle (so V runs from M to 1)."""
    top = float(angles.max()) if angles.size else 0.0
    grid = np.linspace(0.0, math.ceil(top) + 1.0, 25)
    return sorted({round(float(t), 4) for t in [*grid, threshold]})


def plot_angles(angles: np.ndarray, domains: Sequence[str], labels: Sequence[int], path: Path) -> None:
    """Heat-map of the angle matrix, clients ordered by cluster, ticks naming each client's true domain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(range(len(labels)), key=lambda k: (labels[k], k))
    fig, ax = plt.subplots(figsize=(1.0 + 0.35 * len(order), 0.6 + 0.35 * len(order)))
    im = ax.imshow(angles[np.ix_(order, order)], cmap="viridis")
    ticks = [f"{k}:{domains[k]}|c{labels[k]}" for k in order]
    ax.set_xticks(range(len(order)), ticks, rotation=90, fontsize=6)
    ax.set_yticks(range(len(order)), ticks, fontsize=6)
    fig.colorbar(im, ax=ax, label="θ1 (degrees)")
    ax.set_title("FKPL Stage 0: principal angles")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
