"""A benchmark's layout: each domain's image pools with its split rows, and each client's rows, before any embedding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flsuite.data.image_arrays import ImageArrays
from flsuite.data.indexed_pool import IndexedPool


@dataclass
class DomainData:
    """One domain's image pools and which of their rows form its training and test splits (disjoint); an
    `IndexedPool` where the data comes from the feature cache's index (`Benchmark.use_index`)."""

    train_pool: ImageArrays | IndexedPool
    train_rows: np.ndarray
    test_pool: ImageArrays | IndexedPool
    test_rows: np.ndarray
    pools: tuple[str, str]  # the pools' names in cache keys: ("train", "test") or ("all", "all")


@dataclass
class BenchmarkLayout:
    """A benchmark's domains and each client's (domain, rows of the domain's training pool), in client-id order."""

    domains: dict[str, DomainData]
    clients: list[tuple[str, np.ndarray]]
    dropped: int
