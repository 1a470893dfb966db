"""FKPL's official Stage 0 (lqh7606/FKPL): the count-proportional class budget, Stage 0's own inputs (resize,
augmentation, ImageNet normalisation), PACFL's angle on per-class bases, the official agglomeration, and a run's
Stage 0 computed with exactly those options and seeds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from flsuite.data.base import ClientData, DataSource, FederatedData, Split
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl.cluster import angle_matrix, cluster
from flsuite.methods.fkpl.subspace import CROP_PADDING, SubspaceBasis, class_budget, client_bases, stage0_inputs
from flsuite.models.heads import SmallCNN
from flsuite.models.image_preprocessing import IMAGENET_MEAN, IMAGENET_STD
from tests.helpers import head_federation

MEAN, STD = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)


def test_the_class_budget_is_the_official_count_proportional_rule_worked_by_hand():
    # (4, 3, 3): shares 0.4 ≥ 1/3 → weight 4; 0.3 < 1/3 → weight 0.3 each; r = 10·w/4.6 = (8.696, 0.652, 0.652);
    # floors (8, 0, 0), 2 left; growth (1 − 2·frac)/√max(1, r) = −0.133, −0.304, −0.304 → the two small classes
    # (largest remainders would give 9, 1, 0; plain count-proportional rounding 4, 3, 3)
    assert class_budget([4, 3, 3], 10) == [8, 1, 1]
    # (4, 1, 1): w = (4, 1/6, 1/6), r = (9.231, 0.385, 0.385), 1 left; growth 0.177 < 0.231 → the big class: the
    # minority classes get no vector (and upload nothing)
    assert class_budget([4, 1, 1], 10) == [10, 0, 0]
    # (3, 2, 1): 2/6 is exactly 1/3, so class 1 weighs its count: r = (5.806, 3.871, 0.323) → (6, 4, 0)
    # (a strict '>' would weigh it 1/3: r = (8.571, 0.952, 0.476) → (9, 1, 0))
    assert class_budget([3, 2, 1], 10) == [6, 4, 0]
    assert class_budget([7] * 10, 10) == [1] * 10
    assert class_budget([4, 3, 3], 10, "floor") == [3, 3, 3]


def test_stage0_normalises_with_the_imagenet_mean_and_std_and_leaves_the_training_inputs_alone():
    x = torch.full((2, 3, 4, 4), 0.5)
    out = stage0_inputs(x, None, False, True, torch.Generator().manual_seed(0))
    expected = [(0.5 - 0.485) / 0.229, (0.5 - 0.456) / 0.224, (0.5 - 0.406) / 0.225]  # 0.0655, 0.1964, 0.4178
    assert torch.allclose(out, torch.tensor(expected).view(1, 3, 1, 1).expand(2, 3, 4, 4), atol=1e-6)
    assert torch.equal(x, torch.full((2, 3, 4, 4), 0.5))  # the client's stored inputs (the training loop's) unchanged
    assert stage0_inputs(x, 2, False, False, torch.Generator()).shape == (2, 3, 2, 2)  # resized (a constant stays)


def test_stage0_augmentation_is_the_official_pad_crop_flip_before_the_normalisation_and_seeded():
    x = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    out = stage0_inputs(x, None, True, True, torch.Generator().manual_seed(5))
    p, seen = 4, set()  # the official RandomCrop(32, padding=4)
    assert CROP_PADDING == p
    for n in range(len(x)):  # torchvision's RandomCrop(8, padding=4, fill 0) + RandomHorizontalFlip, then Normalize
        padded = TF.pad(x[n], [p, p, p, p], fill=0.0)
        crops = {(i, j): TF.crop(padded, i, j, 8, 8) for i in range(2 * p + 1) for j in range(2 * p + 1)}
        candidates = {
            (i, j, f): TF.horizontal_flip(c) if f else c for (i, j), c in crops.items() for f in (False, True)
        }
        hits = [key for key, c in candidates.items() if torch.allclose(out[n], (c - MEAN) / STD, atol=1e-5)]
        assert len(hits) == 1, n
        seen.add(hits[0])
    assert len({f for *_, f in seen}) == 2 and len(seen) > 20  # both flips, many offsets
    assert torch.equal(out, stage0_inputs(x, None, True, True, torch.Generator().manual_seed(5)))
    assert not torch.equal(out, stage0_inputs(x, None, True, True, torch.Generator().manual_seed(6)))


def _images(z: list[torch.Tensor]) -> torch.Tensor:
    """Raw images whose ImageNet-normalised versions are exactly `z` (each 3×2×2, flattened channel-major)."""
    return torch.stack([MEAN + STD * v.view(3, 2, 2) for v in z])


def test_the_official_stage0_on_a_tiny_set_gives_the_hand_computed_angle_matrix():
    e = torch.eye(12)
    c, s = math.cos, math.sin
    v = c(math.radians(20)) * e[0] + s(math.radians(20)) * e[1]
    w = c(math.radians(50)) * e[2] + s(math.radians(50)) * e[3]
    q = c(math.radians(70)) * e[0] + s(math.radians(70)) * e[5]
    r = -0.7 * e[10] + math.sqrt(0.51) * e[4]  # its largest entry positive, so its sign stays; r·e10 = −0.7
    # each class's normalised samples are orthogonal, so its left singular vectors are their directions (by norm)
    clients = [
        (
            [0.4 * e[0], 0.3 * e[7], 0.2 * e[8], 0.1 * e[9], 0.3 * e[5], 0.3 * e[6]],
            [0, 0, 0, 0, 1, 2],
        ),  # budget (10, 0, 0): U = [e0 e7 e8 e9]
        (
            [0.4 * v, 0.2 * e[10], 0.4 * e[2], 0.2 * e[11]],
            [0, 0, 1, 1],
        ),  # budget (5, 5), rank 2 each: U = [v e10 e2 e11]
        ([0.4 * w, 0.2 * r, 0.4 * q, 0.2 * e[6]], [1, 1, 2, 2]),  # U = [w r q e6]
    ]
    data = [ClientData(k, f"d{k}", Split(_images(z), torch.tensor(y))) for k, (z, y) in enumerate(clients)]
    query = SubspaceBasis(10, per_class=True, budget="counts", normalize=True)
    angles = angle_matrix([query.compute(client, None, None)["basis"] for client in data], "pacfl")
    # (0,1): e0·v = cos 20°; (0,2): e0·q = cos 70° (e5, e6 are not in U_0: their classes get no vector); (1,2): e2·w =
    # cos 50° (e10·r = −0.7 is 134.4°, no |·|: 45.6° with it)
    assert angles == pytest.approx(np.array([[0, 20, 70], [20, 0, 50], [70, 50, 0]]), abs=1e-3)
    assert cluster(angles, 30.0, "weighted") == [0, 0, 1]  # {0,1} at 20°, then ({0,1}, 2) = (70 + 50)/2 = 60° > 30°


def test_the_official_agglomeration_averages_rows_pairwise_and_merges_at_the_threshold():
    a = np.array([[0, 1, 3, 10], [1, 0, 3, 10], [3, 3, 0, 4], [10, 10, 4, 0]], dtype=float)
    # {0,1} at 1, {0,1,2} at 3; then to 3: weighted (10 + 4)/2 = 7, average (UPGMA) (10 + 10 + 4)/3 = 8
    assert cluster(a, 7.5, "weighted") == [0, 0, 0, 0] and cluster(a, 7.5, "average") == [0, 0, 0, 1]
    assert cluster(a, 3.0, "weighted") == [0, 0, 0, 1] and cluster(a, 3.0, "average") == [0, 0, 1, 2]  # ≤ against <
    rng = np.random.default_rng(0)
    for _ in range(20):  # WPGMA is scipy's "weighted"; fcluster's "distance" keeps merges at or below t
        d = rng.uniform(1, 50, size=(9, 9))
        d = (d + d.T) / 2
        np.fill_diagonal(d, 0)
        t = float(rng.uniform(5, 40))
        ref = fcluster(linkage(squareform(d), "weighted"), t, "distance")
        order: dict[int, int] = {}
        assert cluster(d, t, "weighted") == [order.setdefault(int(r), len(order)) for r in ref]


class TinyImages(DataSource):
    """2 domains × 2 clients of 3×8×8 images (3 classes): a domain's images share a colour pattern."""

    def build(self, seed: int) -> FederatedData:
        g = torch.Generator().manual_seed(seed)
        pattern = torch.rand(2, 3, 8, 8, generator=g)

        def draw(d: int, n: int) -> Split:
            y = torch.arange(n) % 3
            return Split(
                (0.6 * pattern[d] + 0.2 * torch.rand(n, 3, 8, 8, generator=g) + 0.05 * y.view(-1, 1, 1, 1)).clamp(0, 1),
                y,
            )

        clients = [ClientData(k, f"d{k // 2}", draw(k // 2, 24)) for k in range(4)]
        return FederatedData(clients, {f"d{d}": draw(d, 12) for d in range(2)}, num_classes=3)


def test_a_runs_official_stage0_is_the_one_client_bases_computes(tmp_path):
    fed = TinyImages().build(7)  # head_federation's seed
    query = SubspaceBasis(4, per_class=True, budget="counts", size=4, augment=True, normalize=True)
    angles = angle_matrix(client_bases(fed, query, 7), "pacfl")
    closest = float(angles[~np.eye(4, dtype=bool)].min())  # at exactly this threshold only the official rule (≤) merges
    official = dict(
        per_class=True,
        class_budget="counts",
        angle="pacfl",
        linkage="weighted",
        stage0_size=4,
        stage0_augment=True,
        stage0_normalize=True,
    )
    fkpl = FKPL(threshold=closest, basis=4, head_epochs=1, head_batch_size=16, **official)
    assert fkpl.subspace_query() == query
    head_federation(tmp_path, data=TinyImages(), model=SmallCNN(channels=(4,), hidden=8), rounds=1, method=fkpl).fit()
    saved = json.loads((tmp_path / "fkpl_clusters.json").read_text())
    assert np.array(saved["angles"]) == pytest.approx(angles, abs=1e-9)
    assert saved["labels"] == cluster(angles, closest, "weighted") != cluster(angles, closest, "average")
    # the augmentation draws from the run's derived seed, and it and the normalisation change the bases
    assert not np.allclose(angle_matrix(client_bases(fed, query, 8), "pacfl"), angles)
    assert not np.allclose(angle_matrix(client_bases(fed, SubspaceBasis(4, True, "counts", 4), 7), "pacfl"), angles)
