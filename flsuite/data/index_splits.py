"""Seeded index splits behind the partitioners: IID and Dirichlet label-skew splits over clients, and a
train/test split for datasets with no official test set. Each returns index arrays; draws come from `rng`."""

from __future__ import annotations

import numpy as np

from flsuite.data.base import DataError


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A uniformly random split into `num_clients` near-equal parts."""
    if num_clients < 1:
        raise DataError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_samples:
        raise DataError(f"cannot split {num_samples} samples over {num_clients} clients (more clients than samples)")
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    rng: np.random.Generator,
    *,
    min_per_class: int = 0,
    min_size: int = 0,
    max_draws: int = 1000,
) -> list[np.ndarray]:
    """Label skew: for each class c, proportions p_c ~ Dir(β·1_K) split that class's samples over the K clients.

    `min_per_class` first gives every client that many samples of every class (the official GGEUR code uses 1),
    then splits the remainder by the Dirichlet draw. Smaller β means more skew. `min_size` is NIID-Bench's rule
    (FedEGG A13): the whole split is drawn again, from the same stream, until every client holds at least that many
    samples (at most `max_draws` draws). With 0, or when the first draw satisfies it, the split is the one-draw split.
    """
    labels = np.asarray(labels)
    if not beta > 0:
        raise DataError(f"Dirichlet beta must be > 0, got {beta}")
    if num_clients < 1:
        raise DataError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(labels):
        raise DataError(f"cannot split {len(labels)} samples over {num_clients} clients (more clients than samples)")
    if min_size * num_clients > len(labels):
        raise DataError(
            f"min_size={min_size} for each of {num_clients} clients needs {min_size * num_clients} samples; "
            f"there are {len(labels)}"
        )
    for _ in range(max_draws):
        parts = _dirichlet_draw(labels, num_clients, beta, rng, min_per_class)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise DataError(
        f"no Dirichlet(beta={beta}) split of {len(labels)} samples over {num_clients} clients gave every client >= "
        f"min_size={min_size} samples in {max_draws} draws; lower min_size or raise beta"
    )


def _dirichlet_draw(
    labels: np.ndarray, num_clients: int, beta: float, rng: np.random.Generator, min_per_class: int
) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        reserved = min_per_class * num_clients
        if reserved > len(idx):
            raise DataError(
                f"class {c} has {len(idx)} samples, "
                f"fewer than min_per_class={min_per_class} for each of {num_clients} clients"
            )
        for k in range(num_clients):
            parts[k].append(idx[k * min_per_class : (k + 1) * min_per_class])
        rest = idx[reserved:]
        proportions = rng.dirichlet(np.full(num_clients, beta))
        cuts = (np.cumsum(proportions)[:-1] * len(rest)).astype(int)
        for k, chunk in enumerate(np.split(rest, cuts)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def train_test_split_indices(
    num_samples: int, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded disjoint (train, test) index split, for datasets with no official test set."""
    if not 0 < test_fraction < 1:
        raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
    order = rng.permutation(num_samples)
    n_test = int(round(num_samples * test_fraction))
    return np.sort(order[n_test:]), np.sort(order[:n_test])
