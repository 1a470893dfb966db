"""Data sources that need no download: the quickstart federation and a synthetic feature-vector federation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from flsuite.data.base import ClientData, DataError, DataSource, FederatedData, Split
from flsuite.data.index_splits import dirichlet_partition, iid_partition, train_test_split_indices
from flsuite.seeding import numpy_rng

_DIGIT_SHIFTS = ("clean", "inverted", "rotated", "noisy", "shifted")


def _shift_digits(images: np.ndarray, shift: str, rng: np.random.Generator) -> np.ndarray:
    """One of the synthetic domain shifts applied to [N, 8, 8] images with values in [0, 1]."""
    if shift == "clean":
        return images
    if shift == "inverted":
        return 1.0 - images
    if shift == "rotated":
        return np.rot90(images, k=1, axes=(1, 2)).copy()
    if shift == "noisy":
        return np.clip(images + rng.normal(0.0, 0.25, size=images.shape), 0.0, 1.0)
    if shift == "shifted":
        return np.roll(images, shift=(2, 2), axis=(1, 2))
    raise DataError(f"unknown digit domain shift {shift!r}; expected one of {_DIGIT_SHIFTS}")


class UCIDigitsDomains(DataSource):
    """The quickstart federation: scikit-learn's UCI 8×8 digits (1,797 images, shipped with scikit-learn) cut into
    disjoint shards, one per domain, each shard seen through a different synthetic shift.

    Every domain keeps a seeded test split of its own; its training split is divided among
    `clients_per_domain` clients (IID, or Dirichlet(β) label skew when `beta` is set).

    Args:
        domains: Domain shifts, from "clean", "inverted", "rotated", "noisy", "shifted".
        clients_per_domain: Clients holding each domain's training data.
        test_fraction: Fraction of each domain held out as its test set.
        beta: Dirichlet concentration for label skew among a domain's clients; null for IID.
        flatten: Give 64-d vectors (for head models) instead of [1, 8, 8] images.
    """

    def __init__(
        self,
        domains: Sequence[str] = ("clean", "inverted", "rotated", "noisy"),
        clients_per_domain: int = 1,
        test_fraction: float = 0.3,
        beta: float | None = None,
        flatten: bool = False,
    ) -> None:
        unknown = [d for d in domains if d not in _DIGIT_SHIFTS]
        if unknown:
            raise DataError(f"unknown digit domain shift(s) {unknown}; expected some of {list(_DIGIT_SHIFTS)}")
        if len(set(domains)) != len(domains):
            raise DataError(f"domains must be distinct, got {list(domains)}")
        if clients_per_domain < 1:
            raise DataError(f"clients_per_domain must be >= 1, got {clients_per_domain}")
        self.domains, self.clients_per_domain = list(domains), clients_per_domain
        self.test_fraction, self.beta, self.flatten = test_fraction, beta, flatten

    def build(self, seed: int) -> FederatedData:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = digits.images.astype(np.float64) / 16.0
        labels = digits.target.astype(np.int64)
        rng = numpy_rng(seed, purpose="data/uci_digits_domains")
        shards = np.array_split(rng.permutation(len(labels)), len(self.domains))
        clients: list[ClientData] = []
        test: dict[str, Split] = {}
        for name, shard in zip(self.domains, shards):
            x = _shift_digits(images[shard], name, rng)
            x = x.reshape(len(shard), -1) if self.flatten else x[:, None]
            domain = Split(torch.tensor(x, dtype=torch.float32), torch.tensor(labels[shard]))
            train_idx, test_idx = train_test_split_indices(len(shard), self.test_fraction, rng)
            train = domain.subset(train_idx)
            test[name] = domain.subset(test_idx)
            if self.beta is None:
                parts = iid_partition(len(train), self.clients_per_domain, rng)
            else:
                parts = dirichlet_partition(train.y.numpy(), self.clients_per_domain, self.beta, rng)
            for part in parts:
                clients.append(ClientData(len(clients), name, train.subset(part)))
        return FederatedData(
            clients,
            test,
            num_classes=10,
            description={"source": "sklearn.datasets.load_digits", "shifts": self.domains},
        )


class GaussianFeatures(DataSource):
    """Synthetic embedding vectors: class means shared by all domains plus a per-domain offset plus N(0, I) noise.

    A fast stand-in for "frozen encoder + head" federations (tests, smoke runs).

    Args:
        dim: Feature dimension.
        num_classes: Number of classes.
        num_domains: Number of domains (each with its own offset and test set).
        clients_per_domain: Clients per domain.
        samples_per_client: Training samples per client.
        test_per_domain: Test samples per domain.
        class_separation: Scale of the class means.
        domain_shift: Scale of the per-domain offsets.
        beta: Dirichlet concentration of each client's label distribution; null for uniform labels.
    """

    def __init__(
        self,
        dim: int = 16,
        num_classes: int = 4,
        num_domains: int = 2,
        clients_per_domain: int = 2,
        samples_per_client: int = 200,
        test_per_domain: int = 200,
        class_separation: float = 1.5,
        domain_shift: float = 1.0,
        beta: float | None = None,
    ) -> None:
        if min(dim, num_classes, num_domains, clients_per_domain, samples_per_client, test_per_domain) < 1:
            raise DataError("GaussianFeatures sizes must all be >= 1")
        if beta is not None and not beta > 0:
            raise DataError(f"beta must be > 0 or null, got {beta}")
        self.dim, self.num_classes, self.num_domains = dim, num_classes, num_domains
        self.clients_per_domain, self.samples_per_client, self.test_per_domain = (
            clients_per_domain,
            samples_per_client,
            test_per_domain,
        )
        self.class_separation, self.domain_shift, self.beta = class_separation, domain_shift, beta

    def build(self, seed: int) -> FederatedData:
        rng = numpy_rng(seed, purpose="data/gaussian_features")
        means = rng.normal(size=(self.num_classes, self.dim)) * self.class_separation
        offsets = rng.normal(size=(self.num_domains, self.dim)) * self.domain_shift

        def draw(domain: int, labels: np.ndarray) -> Split:
            x = means[labels] + offsets[domain] + rng.normal(size=(len(labels), self.dim))
            return Split(torch.tensor(x, dtype=torch.float32), torch.tensor(labels))

        clients: list[ClientData] = []
        test: dict[str, Split] = {}
        uniform = np.full(self.num_classes, 1.0 / self.num_classes)
        for d in range(self.num_domains):
            name = f"domain{d}"
            for _ in range(self.clients_per_domain):
                p = uniform if self.beta is None else rng.dirichlet(np.full(self.num_classes, self.beta))
                clients.append(
                    ClientData(len(clients), name, draw(d, rng.choice(self.num_classes, self.samples_per_client, p=p)))
                )
            test[name] = draw(d, rng.choice(self.num_classes, self.test_per_domain))
        return FederatedData(clients, test, num_classes=self.num_classes, description={"source": "synthetic gaussian"})
