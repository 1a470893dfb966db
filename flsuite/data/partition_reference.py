"""Reference partitions without skew: `IID` (a uniform split of one domain) and `Centralised` (one client holds it)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flsuite.data.base import DataError
from flsuite.data.index_splits import iid_partition
from flsuite.data.partition import ClientIndices, Partitioner
from flsuite.data.partition_checks import _check_enough_samples, _check_num_clients, _labels, _single_domain

__all__ = ["IID", "Centralised"]


class IID(Partitioner):
    """Uniform random near-equal split of a single domain's training data (the IID reference setting).

    Args:
        num_clients: Number of clients (>= 1).
    """

    def __init__(self, num_clients: int = 10) -> None:
        _check_num_clients(num_clients)
        self.num_clients = int(num_clients)

    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        labels = _labels(train_labels, num_classes)
        domain = _single_domain(labels, "IID")
        _check_enough_samples(domain, len(labels[domain]), self.num_clients)
        return [ClientIndices(domain, part) for part in iid_partition(len(labels[domain]), self.num_clients, rng)]


class Centralised(Partitioner):
    """One client holding the whole training split (linear probes; "FedAvg with 1 client" sanity checks).

    Single-domain only: for several domains, pool them into one domain in the data source, or use
    DomainSkew(clients_per_domain=1) for one client per domain.
    """

    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        labels = _labels(train_labels, num_classes)
        domains = list(labels)
        if len(domains) != 1:
            raise DataError(
                f"Centralised holds a single domain, but the data has {len(domains)} domains {domains}; pool them into "
                "one domain in the data source, or use DomainSkew(clients_per_domain=1) for one client per domain"
            )
        domain = domains[0]
        _check_enough_samples(domain, len(labels[domain]), 1)
        return [ClientIndices(domain, np.arange(len(labels[domain]), dtype=np.int64))]
