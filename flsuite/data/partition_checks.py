"""Argument and label checks shared by the partitioners in :mod:`flsuite.data.partition`, and the per-domain
Dirichlet label-skew step (`_label_skew`) that Dirichlet and DomainSkew both use."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flsuite.data.base import DataError
from flsuite.data.index_splits import dirichlet_partition


def _check_num_clients(num_clients: int, name: str = "num_clients") -> None:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise DataError(f"{name} must be an integer >= 1, got {num_clients!r}")


def _check_beta(beta: float) -> None:
    if not beta > 0 or not np.isfinite(beta):
        raise DataError(f"beta (Dirichlet concentration) must be a finite number > 0, got {beta!r}")


def _check_min_per_class(min_per_class: int) -> None:
    if isinstance(min_per_class, bool) or not isinstance(min_per_class, int | np.integer) or min_per_class < 0:
        raise DataError(f"min_per_class must be an integer >= 0, got {min_per_class!r}")


def _labels(train_labels: Mapping[str, np.ndarray], num_classes: int) -> dict[str, np.ndarray]:
    """Each domain's labels as a 1-D int64 array, checked against `num_classes`."""
    if not train_labels:
        raise DataError("no domains to partition (train_labels is empty)")
    if num_classes < 1:
        raise DataError(f"num_classes must be >= 1, got {num_classes}")
    out: dict[str, np.ndarray] = {}
    for domain, labels in train_labels.items():
        y = np.asarray(labels)
        if y.ndim != 1:
            raise DataError(f"labels of domain {domain!r} must be 1-D, got shape {y.shape}")
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes):
            raise DataError(
                f"labels of domain {domain!r} must be integers in [0, {num_classes}), got values {np.unique(y)[:10]}..."
            )
        out[domain] = y.astype(np.int64, copy=False)
    return out


def _single_domain(train_labels: Mapping[str, np.ndarray], protocol: str) -> str:
    domains = list(train_labels)
    if len(domains) != 1:
        raise DataError(
            f"{protocol} partitions a single domain, but the data has {len(domains)} domains {domains}; "
            "use DomainSkew for multi-domain data"
        )
    return domains[0]


def _check_enough_samples(domain: str, num_samples: int, num_clients: int) -> None:
    if num_clients > num_samples:
        raise DataError(
            f"domain {domain!r} has {num_samples} training samples to share but {num_clients} clients "
            "(more clients than samples)"
        )


def _check_min_per_class_possible(
    domain: str, labels: np.ndarray, num_classes: int, num_clients: int, min_per_class: int
) -> None:
    if min_per_class == 0:
        return
    counts = np.bincount(labels, minlength=num_classes)
    need = min_per_class * num_clients
    for c in range(num_classes):
        if counts[c] < need:
            raise DataError(
                f"min_per_class={min_per_class} is impossible in domain {domain!r}: class {c} has {counts[c]} samples, "
                f"but {num_clients} clients × {min_per_class} = {need} are needed"
            )


def _label_skew(
    domain: str,
    labels: np.ndarray,
    num_classes: int,
    num_clients: int,
    beta: float,
    min_per_class: int,
    rng: np.random.Generator,
    min_size: int = 0,
) -> list[np.ndarray]:
    _check_enough_samples(domain, len(labels), num_clients)
    _check_min_per_class_possible(domain, labels, num_classes, num_clients, min_per_class)
    try:
        return dirichlet_partition(labels, num_clients, beta, rng, min_per_class=min_per_class, min_size=min_size)
    except DataError as err:
        raise DataError(f"domain {domain!r}: {err}") from None
