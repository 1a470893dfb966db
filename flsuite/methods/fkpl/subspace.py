"""FKPL Stage 0, client side: the basis U_m a client uploads (spec §1.2, following PACFL); the server side (angles,
clustering) is `flsuite.methods.fkpl.cluster`.

U_m holds the leading left singular vectors of X_m (one column per training sample, inputs flattened): of the whole
client (default), or per class, stacked in ascending class order (`per_class`), the budget p split over the classes
by `class_budget`:
    "floor":  ⌊p/|K_m|⌋ ≥ 1 vectors for every class;
    "counts": the official code's count-proportional rule (lqh7606/FKPL fkpl_officecaltech.py lines 163-186,
              hierarchical_clustering.py `round_to`): a class k with share n_k/N ≥ 1/|K_m| weighs n_k, any other
              weighs n_k/N (so it gets almost nothing); r_k = p·w_k/Σw; K_k = ⌊r_k⌋, and the p − Σ⌊r⌋ left over go
              one each to the classes whose error (r − K)²/√max(1, r) grows least by it (ties: lower class first);
              a class with K_k = 0 uploads nothing.
Stage 0 may see its own inputs (never the training loop's, which stay as the data built them): resized to
`size` (antialiased bilinear, as `Benchmark` resizes), augmented once per sample as the official training transform
(zero padding 4, random crop, flip with p = 1/2; drawn from the query's derived seed), then ImageNet mean/std
normalised; the official Stage 0 reads its samples through that transform: Resize 32, RandomCrop(32, padding=4),
RandomHorizontalFlip, ToTensor, Normalize (fkpl_officecaltech.py lines 67-74, 199-201).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from flsuite.data.augment import Augment
from flsuite.data.base import ClientData, FederatedData
from flsuite.federation.query import ClientQuery, QueryTask
from flsuite.methods.fkpl.settings import ClassBudget, ClusterSettings
from flsuite.models.image_preprocessing import IMAGENET_MEAN, IMAGENET_STD
from flsuite.seeding import derive_seed

#: The official training transform's RandomCrop padding (at 32×32).
CROP_PADDING = 4


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


def round_to_budget(shares: Sequence[float], budget: int) -> list[int]:
    """Integers summing to `budget` from non-negative `shares` summing to it: the floors, then one more each for the
    classes whose error e(K) = (r − K)²/√max(1, r) grows least from ⌊r⌋ to ⌊r⌋ + 1 (ties: lower index first)."""
    if not np.isclose(sum(shares), budget):
        raise ValueError(f"shares must sum to the budget {budget}, got {sum(shares)}")

    def error(r: float, k: int) -> float:
        return abs(k - r) ** 2 / np.sqrt(1.0 if r < 1.0 else r)

    out = [int(r) for r in shares]
    growth = sorted((error(r, k + 1) - error(r, k), i) for i, (r, k) in enumerate(zip(shares, out, strict=True)))
    for _, i in growth[: budget - sum(out)]:
        out[i] += 1
    return out


def class_budget(counts: Sequence[int], budget: int, rule: ClassBudget = "counts") -> list[int]:
    """Basis vectors per class from the client's class counts (classes in ascending order), see the module docstring."""
    if rule == "floor":
        return [max(1, budget // len(counts))] * len(counts)
    total, base = sum(counts), 1 / len(counts)
    weights = [n if n / total >= base else n / total for n in counts]
    return round_to_budget([w / sum(weights) * budget for w in weights], budget)


def stage0_inputs(
    x: torch.Tensor, size: int | None, augment: bool, normalize: bool, generator: torch.Generator
) -> torch.Tensor:
    """Stage 0's view of a client's images [N, C, H, W] in [0, 1]: resized, augmented, normalised (each optional)."""
    if (size or augment or normalize) and x.ndim != 4:
        raise ValueError(
            f"FKPL stage0_size/stage0_augment/stage0_normalize need image inputs [N, C, H, W], got {list(x.shape)}"
        )
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    if augment:
        x = Augment(crop_padding=CROP_PADDING, hflip=True)(x, generator)
    if normalize:
        if x.shape[1] != 3:
            raise ValueError(f"ImageNet normalisation needs 3 channels, got {x.shape[1]}")
        mean, std = (torch.tensor(v, dtype=x.dtype).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
        x = (x - mean) / std
    return x


@dataclass
class SubspaceBasis(ClientQuery):
    """Client side of Stage 0: upload the truncated-SVD basis of the client's training inputs (only U_m).

    `size`, `augment`, `normalize` shape Stage 0's inputs only (module docstring); the augmentation draws from a
    generator seeded with the task's derived seed (seed, client, "query/fkpl/subspace"): a run and
    `client_bases` draw the same, and a task-less call (tests) uses seed 0's."""

    p: int = 10
    per_class: bool = False
    budget: ClassBudget = "floor"
    size: int | None = None
    augment: bool = False
    normalize: bool = False

    name = "fkpl/subspace"

    @classmethod
    def of(cls, settings: ClusterSettings) -> SubspaceBasis:
        """Stage 0's query as `settings` configure it (the run, experiments/fkpl_stage0.py and the config tests use
        it)."""
        return cls(
            settings.basis,
            settings.per_class,
            settings.class_budget,
            settings.stage0_size,
            settings.stage0_augment,
            settings.stage0_normalize,
        )

    def compute(self, client, task: QueryTask | None, model) -> dict[str, Any]:
        seed = task.seed if task is not None else derive_seed(0, client=client.client_id, purpose=f"query/{self.name}")
        x = stage0_inputs(client.train.x, self.size, self.augment, self.normalize, torch.Generator().manual_seed(seed))
        if not self.per_class:
            return {"basis": subspace_basis(x, self.p)}
        y = client.train.y
        classes, counts = torch.unique(y, return_counts=True)
        per = class_budget(counts.tolist(), self.p, self.budget)
        return {
            "basis": torch.cat(
                [subspace_basis(x[y == c], k) for c, k in zip(classes, per, strict=True) if k > 0], dim=1
            )
        }


def client_basis(client: ClientData, query: SubspaceBasis, seed: int) -> torch.Tensor:
    """One client's upload as a run with master seed `seed` computes it (the same derived task seed), without a run."""
    k = client.client_id
    return query.compute(client, QueryTask(k, derive_seed(seed, client=k, purpose=f"query/{query.name}"), query), None)[
        "basis"
    ]


def client_bases(data: FederatedData, query: SubspaceBasis, seed: int) -> list[torch.Tensor]:
    """Every client's upload (`client_basis`), in client-id order."""
    return [client_basis(c, query, seed) for c in data.clients]
