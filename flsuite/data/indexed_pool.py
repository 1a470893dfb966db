"""A Benchmark pool known from the feature cache's index (`flsuite.data.cache_index`): labels, class names and the cache
file, no images (`Benchmark.use_index`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from flsuite.data.base import DataError

__all__ = ["IndexedPool", "StaleIndexError"]


class StaleIndexError(DataError):
    """A pool the cache's index named is not in the cache file as recorded (the build then runs as without the
    index)."""


class IndexedPool:
    """A pool known from the feature cache's index (`flsuite.data.cache_index`): its labels, class names and cache file,
    no images. `features(rows)` reads the rows' embeddings from the cache file, as `extract_features` serves them."""

    def __init__(self, name: str, entry: dict) -> None:
        self.name, self.cache = name, Path(entry["cache"])
        self.y = torch.tensor(entry["labels"], dtype=torch.int64)
        self.classes: tuple[str, ...] = tuple(entry["classes"])
        if len(self.y) != entry["size"]:
            raise StaleIndexError(f"the cache index's pool {name} has {len(self.y)} labels for {entry['size']} images")
        self._features: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.y)

    def features(self, rows: np.ndarray) -> torch.Tensor:
        index = torch.as_tensor(np.asarray(rows), dtype=torch.long)
        if self._features is None:
            try:
                payload = torch.load(self.cache, map_location="cpu", weights_only=True)
                features, done = payload["features"], payload["done"]
            except Exception as err:  # noqa: BLE001 - any unreadable file: the build runs as without the index
                raise StaleIndexError(
                    f"the cache file {self.cache} of pool {self.name} is unreadable ({err})"
                ) from None
            if not (
                isinstance(features, torch.Tensor)
                and features.dtype == torch.float32
                and features.shape[0] == len(self)
            ):
                raise StaleIndexError(
                    f"the cache file {self.cache} does not hold pool {self.name}'s {len(self)} float32 rows"
                )
            if not bool(done[index].all()):
                raise StaleIndexError(f"the cache file {self.cache} lacks rows of pool {self.name}")
            self._features = features
        return self._features[index]
