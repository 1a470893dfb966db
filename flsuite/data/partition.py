"""Partition protocols: which training samples each client holds. Everything is seeded through `rng`.

The functions return a list of index arrays, one per client; together they cover the input exactly once. The
`Partitioner` classes below wrap them as config-selectable protocols over several domains; the reference ones without
skew, `IID` and `Centralised`, are in `flsuite.data.partition_reference`.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from flsuite.data.base import DataError
from flsuite.data.index_splits import (
    iid_partition,
)
from flsuite.data.partition_checks import (
    _check_beta,
    _check_enough_samples,
    _check_min_per_class,
    _check_num_clients,
    _label_skew,
    _labels,
    _single_domain,
)

__all__ = ["ClientIndices", "Dirichlet", "DomainSkew", "LabelDomainSkew", "Partitioner", "drop_empty_clients"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------------------
# Config-selectable partition protocols (chosen in YAML with `class_path` + `init_args`).
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ClientIndices:
    """One client's share: sorted int64 indices into the TRAIN split of `domain`."""

    domain: str
    indices: np.ndarray

    def __post_init__(self) -> None:
        indices = np.asarray(self.indices)
        if indices.ndim != 1:
            raise DataError(f"client indices of domain {self.domain!r} must be 1-D, got shape {indices.shape}")
        object.__setattr__(self, "indices", np.sort(indices.astype(np.int64, copy=False)))

    def __len__(self) -> int:
        return int(self.indices.shape[0])


class Partitioner(abc.ABC):
    """Decides which training samples of which domain each client holds."""

    @abc.abstractmethod
    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        """Clients' shares, given each domain's training labels (domains in order); every draw comes from `rng`."""


def drop_empty_clients(clients: list[ClientIndices]) -> tuple[list[ClientIndices], int]:
    """Remove clients holding no samples (e.g. Dirichlet with a tiny β); log which, and return how many were dropped."""
    kept = [c for c in clients if len(c) > 0]
    dropped = [(c.domain, i) for i, c in enumerate(clients) if len(c) == 0]
    if dropped:
        where = ", ".join(f"(domain {d!r}, position {i})" for d, i in dropped)
        log.warning("dropped %d empty client(s) of %d: %s", len(dropped), len(clients), where)
    return kept, len(dropped)


class Dirichlet(Partitioner):
    """Label skew on a single domain (GGEUR App. B, CIFAR / Tiny-ImageNet: 10 clients): for each class c,
    proportions p_c ~ Dir(β·1_K) split that class's samples over the K clients. Smaller β means more skew.

    Args:
        num_clients: Number of clients K (>= 1).
        beta: Dirichlet concentration β (> 0); GGEUR names 0.01, 0.03, 0.05 for CIFAR-100.
        min_per_class: Samples of every class each client gets before the Dirichlet split (official GGEUR code: 1).
        min_size: Draw the split again until every client holds at least this many samples (NIID-Bench's rule,
            FedEGG A13: 10); 0 keeps the first draw (empty clients are then dropped by the data source).
    """

    def __init__(self, num_clients: int = 10, beta: float = 0.5, min_per_class: int = 0, min_size: int = 0) -> None:
        _check_num_clients(num_clients)
        _check_beta(beta)
        _check_min_per_class(min_per_class)
        if min_size < 0:
            raise DataError(f"Dirichlet min_size must be >= 0, got {min_size}")
        self.num_clients, self.beta, self.min_per_class, self.min_size = (
            int(num_clients),
            float(beta),
            int(min_per_class),
            int(min_size),
        )

    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        labels = _labels(train_labels, num_classes)
        domain = _single_domain(labels, "Dirichlet")
        parts = _label_skew(
            domain, labels[domain], num_classes, self.num_clients, self.beta, self.min_per_class, rng, self.min_size
        )
        return [ClientIndices(domain, part) for part in parts]


class DomainSkew(Partitioner):
    """Domain skew: each client holds data of one domain.

    Each domain keeps a uniformly random `fraction` of its training split (GGEUR App. B: Digits 0.1, Office-Caltech
    and PACS 0.3, one client per domain; `round(fraction·n)`, at least 1 sample), which is divided among that
    domain's clients: IID, or Dirichlet(β) label skew inside the domain when `beta` is set. Clients come domain by
    domain in the data's domain order. FKPL/FPL put different numbers of clients on different domains: pass a mapping
    (FPL's "20% per client" with k clients on a domain is fraction = 0.2·k here, since `fraction` is per domain).

    `client_fraction` is the official FPL/FKPL layout instead (`partition_office_domain_skew_loaders`): every client of
    a domain draws `int(f·n)` samples of that domain's n training samples, disjoint from the domain's other clients
    (successive slices of one seeded permutation), so a domain's k clients hold k·f of it (FKPL's Office: 4/3/2/1
    clients at 0.25/0.25/0.5/1.0; PACS: 4/5/5/6 at 0.2/0.2/0.2/0.1).

    Args:
        fraction: Fraction of each domain's training split handed out, in (0, 1].
        clients_per_domain: Clients per domain: one number for all domains, or a mapping naming every domain.
        beta: Dirichlet concentration for label skew among a domain's clients (> 0); null for an IID split.
        min_per_class: With beta set, samples of every class each client gets before the Dirichlet split.
        client_fraction: Fraction of its domain's training split each client draws (one number, or a mapping naming
            every domain); needs fraction 1 and no beta, and clients × client_fraction <= 1 on every domain.
    """

    def __init__(
        self,
        fraction: float = 1.0,
        clients_per_domain: int | dict[str, int] = 1,
        beta: float | None = None,
        min_per_class: int = 0,
        client_fraction: float | dict[str, float] | None = None,
    ) -> None:
        if not 0 < fraction <= 1:
            raise DataError(f"fraction must be in (0, 1], got {fraction!r}")
        if client_fraction is not None:
            values = client_fraction.values() if isinstance(client_fraction, Mapping) else [client_fraction]
            if not values or not all(0 < float(f) <= 1 for f in values):
                raise DataError(
                    f"client_fraction must be in (0, 1] (one number or one per domain), got {client_fraction!r}"
                )
            if fraction != 1.0 or beta is not None:
                raise DataError(
                    "client_fraction sets each client's share itself: it needs fraction 1 and beta null, "
                    f"got fraction {fraction!r}, beta {beta!r}"
                )
            client_fraction = (
                {str(d): float(f) for d, f in client_fraction.items()}
                if isinstance(client_fraction, Mapping)
                else float(client_fraction)
            )
        self.client_fraction = client_fraction
        if isinstance(clients_per_domain, Mapping):
            if not clients_per_domain:
                raise DataError("clients_per_domain mapping is empty; name every domain with its number of clients")
            for domain, count in clients_per_domain.items():
                _check_num_clients(count, f"clients_per_domain[{domain!r}]")
            clients_per_domain = {str(d): int(k) for d, k in clients_per_domain.items()}
        else:
            _check_num_clients(clients_per_domain, "clients_per_domain")
            clients_per_domain = int(clients_per_domain)
        if beta is not None:
            _check_beta(beta)
        _check_min_per_class(min_per_class)
        if min_per_class and beta is None:
            raise DataError(
                f"min_per_class={min_per_class} needs beta (it applies to the Dirichlet split); "
                "set beta or min_per_class: 0"
            )
        self.fraction, self.clients_per_domain = float(fraction), clients_per_domain
        self.beta, self.min_per_class = (None if beta is None else float(beta)), int(min_per_class)

    def clients_of(self, domains: list[str]) -> dict[str, int]:
        """The number of clients on each domain, checking that a mapping names exactly `domains`."""
        if isinstance(self.clients_per_domain, int):
            return {d: self.clients_per_domain for d in domains}
        missing = [d for d in domains if d not in self.clients_per_domain]
        extra = [d for d in self.clients_per_domain if d not in domains]
        if missing or extra:
            raise DataError(
                f"clients_per_domain must name exactly the domains {domains}; missing {missing}, extra {extra}"
            )
        return {d: self.clients_per_domain[d] for d in domains}

    def client_fractions(self, domains: list[str]) -> dict[str, float]:
        """Each domain's `client_fraction`, checking that a mapping names exactly `domains`."""
        if not isinstance(self.client_fraction, dict):
            return dict.fromkeys(domains, float(self.client_fraction or 0.0))
        missing = [d for d in domains if d not in self.client_fraction]
        extra = [d for d in self.client_fraction if d not in domains]
        if missing or extra:
            raise DataError(
                f"client_fraction must name exactly the domains {domains}; missing {missing}, extra {extra}"
            )
        return {d: self.client_fraction[d] for d in domains}

    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        labels = _labels(train_labels, num_classes)
        counts = self.clients_of(list(labels))
        shares = self.client_fractions(list(labels)) if self.client_fraction is not None else {}
        clients: list[ClientIndices] = []
        for domain, y in labels.items():
            if len(y) == 0:
                raise DataError(f"domain {domain!r} has no training samples")
            if shares:
                each, k = int(shares[domain] * len(y)), counts[domain]
                if each < 1 or k * each > len(y):
                    raise DataError(
                        f"domain {domain!r}: {k} clients × client_fraction {shares[domain]} "
                        f"of its {len(y)} training samples ({each} each) needs 1 <= {k} × {each} <= {len(y)}"
                    )
                order = rng.permutation(len(y))
                clients.extend(ClientIndices(domain, np.sort(order[j * each : (j + 1) * each])) for j in range(k))
                continue
            kept = max(1, round(self.fraction * len(y)))
            _check_enough_samples(domain, kept, counts[domain])
            chosen = np.sort(rng.choice(len(y), size=kept, replace=False))
            if self.beta is None:
                parts = iid_partition(kept, counts[domain], rng)
            else:
                parts = _label_skew(domain, y[chosen], num_classes, counts[domain], self.beta, self.min_per_class, rng)
            clients.extend(ClientIndices(domain, chosen[part]) for part in parts)
        return clients


class LabelDomainSkew(Partitioner):
    """Office-Home-LDS (GGEUR App. B): label and domain skew together, one client per domain.

    A D×C coefficient matrix P is drawn with each column c ~ Dir(β·1_D) (so columns sum to 1; official code
    `dirichlet([β]*D, C).T`); client d keeps the first ⌊P[d,c]·n_train(d,c)⌋ of a random permutation of domain d's
    class-c training indices. GGEUR Table 7 uses β = 0.1; Figs 7 and 9 sweep 0.1 to 5.

    Args:
        beta: Dirichlet concentration β (> 0) of each class's split over the domains.
    """

    def __init__(self, beta: float = 0.1) -> None:
        _check_beta(beta)
        self.beta = float(beta)

    def coefficients(self, num_domains: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
        """The D×C coefficient matrix P; column c ~ Dir(β·1_D). `split` draws it first from its `rng`."""
        return rng.dirichlet(np.full(num_domains, self.beta), size=num_classes).T

    def split_with_coefficients(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> tuple[list[ClientIndices], np.ndarray]:
        """The clients and the coefficient matrix P they were cut with (to record with the run)."""
        labels = _labels(train_labels, num_classes)
        p = self.coefficients(len(labels), num_classes, rng)
        clients: list[ClientIndices] = []
        for d, (domain, y) in enumerate(labels.items()):
            parts = []
            for c in range(num_classes):
                idx = rng.permutation(np.flatnonzero(y == c))
                parts.append(idx[: int(np.floor(p[d, c] * len(idx)))])
            clients.append(ClientIndices(domain, np.concatenate(parts)))
        return clients, p

    def split(
        self, train_labels: Mapping[str, np.ndarray], num_classes: int, rng: np.random.Generator
    ) -> list[ClientIndices]:
        return self.split_with_coefficients(train_labels, num_classes, rng)[0]
