"""FKPL Stage 0, server side (spec §1.2, following PACFL): principal angles between the clients' uploaded bases
U_m (client side: `flsuite.methods.fkpl.subspace`) and the clustering that fixes V; the phase that runs them is
`flsuite.methods.fkpl.clustering`.

    exact (default):   θ1(U_i, U_j) = arccos(clip(σ_max(U_iᵀ U_j), −1, 1)) · 180/π "pacfl" (flag):    θ1(U_i, U_j) =
    min_{a,b} arccos(clip((U_iᵀ U_j)_ab, −1, 1)) · 180/π   (PACFL's code: entrywise, no |·|;
                       lqh7606/FKPL hierarchical_clustering.py `calculating_adjacency`, lines 51-58)
The exact θ1 orthonormalises a stacked per-class basis first (QR: the same span); the PACFL variant uses it as
uploaded, as PACFL does. Clustering on the angle matrix at a threshold in degrees:
    "average" (default): scikit-learn's `AgglomerativeClustering`, average linkage (UPGMA: the mean over all member
                       pairs), merging while the closest pair is < threshold;
    "weighted":        the official code's `hierarchical_clustering(linkage='average')` (lines 66-182): merge the first
                       closest pair in row-major order while it is ≤ threshold, the merged row the mean of the two rows
                       (WPGMA: each side weighs ½ whatever its size).
Only U_m leaves a client (d_x·p scalars, Table 9).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering

from flsuite.methods.fkpl.settings import Angle, Linkage


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


def cluster(angles: np.ndarray, threshold: float, linkage: Linkage = "average") -> list[int]:
    """Cluster labels at `threshold` degrees (see the module docstring for the two linkages), relabelled in order of
    first appearance (client 0 is in 0)."""
    m = len(angles)
    if m == 1:
        return [0]
    if linkage == "weighted":
        raw = weighted_linkage(angles, threshold)
    elif linkage == "average":
        raw = AgglomerativeClustering(
            n_clusters=None, metric="precomputed", linkage="average", distance_threshold=threshold
        ).fit_predict(angles)
    else:
        raise ValueError(f"linkage must be 'average' or 'weighted', got {linkage!r}")
    order: dict[int, int] = {}
    return [order.setdefault(int(c), len(order)) for c in raw]


def weighted_linkage(angles: np.ndarray, threshold: float) -> list[int]:
    """The official code's agglomeration (module docstring): a cluster index per client."""
    a = np.array(angles, dtype=np.float64)
    a = (a + a.T) / 2.0
    groups = [[k] for k in range(len(a))]
    while len(groups) > 1:
        d = a.copy()
        np.fill_diagonal(d, np.inf)
        i, j = np.unravel_index(int(np.argmin(d)), d.shape)  # the first minimum in row-major order, so i < j
        if d[i, j] > threshold:
            break
        a[:, i] = a[i, :] = (a[:, i] + a[:, j]) / 2.0
        a = np.delete(np.delete(a, j, axis=0), j, axis=1)
        groups[i] += groups.pop(j)
    label = {k: v for v, group in enumerate(groups) for k in group}
    return [label[k] for k in range(len(angles))]


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


def threshold_scan(
    angles: np.ndarray, domains: Sequence[str], thresholds: Sequence[float], linkage: Linkage = "average"
) -> list[dict[str, float]]:
    """Threshold → number of clusters V → purity, for the clustering study (cheap: the angles are already known)."""
    rows = []
    for t in thresholds:
        labels = cluster(angles, float(t), linkage)
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
