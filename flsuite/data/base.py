"""The federation's data: each client's training split, every domain's test split and, when the run holds one out
(`validation.fraction`, `flsuite.data.validation`), every domain's validation split.

A `DataSource` (selected in YAML with `class_path`) builds a `FederatedData` for a seed. Everything downstream (the
round loop, methods, evaluation) only sees `FederatedData`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    """Bad data input: a missing file or folder, an impossible partition, an empty split."""


@dataclass(frozen=True)
class Split:
    """Samples held in memory: inputs `x` [N, ...] (float) and integer labels `y` [N]."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(f"split has {self.x.shape[0]} inputs but {self.y.shape[0]} labels")
        if self.y.dtype != torch.int64:
            object.__setattr__(self, "y", self.y.long())

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, index: np.ndarray | torch.Tensor | Sequence[int]) -> Split:
        index = torch.as_tensor(np.asarray(index), dtype=torch.long)
        return Split(self.x[index], self.y[index])


@dataclass(frozen=True)
class ClientData:
    """One client's local training data."""

    client_id: int
    domain: str
    train: Split


@dataclass
class FederatedData:
    """Clients (index = client id), per-domain test sets, and what models need to know about the inputs.

    `validation`: per-domain samples held out of the clients' training splits (`flsuite.data.validation`); empty
    unless the run asks for them, and never seen by a client.
    """

    clients: list[ClientData]
    test: dict[str, Split]
    num_classes: int
    classes: tuple[str, ...] = ()
    description: dict[str, object] = field(default_factory=dict)
    validation: dict[str, Split] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.clients:
            raise DataError("the federation has no clients")
        for i, c in enumerate(self.clients):
            if c.client_id != i:
                raise DataError(f"client ids must be 0..K-1 in order; position {i} holds client {c.client_id}")
        if not self.test:
            raise DataError("the federation has no test set")
        if not self.classes:
            self.classes = tuple(str(i) for i in range(self.num_classes))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.clients[0].train.x.shape[1:])

    @property
    def domains(self) -> list[str]:
        return list(self.test)

    def class_counts(self) -> np.ndarray:
        """Samples per client per class, [K, C]."""
        return np.stack([np.bincount(c.train.y.numpy(), minlength=self.num_classes) for c in self.clients])

    def partition_stats(self) -> dict[str, object]:
        """Samples per client per class, each client's domain, test-set sizes and validation-set sizes when there are
        any (saved with every run)."""
        counts = self.class_counts()
        return {
            "classes": list(self.classes),
            "clients": [
                {
                    "client": c.client_id,
                    "domain": c.domain,
                    "num_samples": len(c.train),
                    "per_class": counts[i].tolist(),
                }
                for i, c in enumerate(self.clients)
            ],
            "test": {d: len(s) for d, s in self.test.items()},
            **({"validation": {d: len(s) for d, s in self.validation.items()}} if self.validation else {}),
            **self.description,
        }


class DataSource(abc.ABC):
    """Builds the federation's data deterministically from a seed."""

    @abc.abstractmethod
    def build(self, seed: int) -> FederatedData: ...

    def source_folders(self) -> list[Path] | None:
        """The folders holding every file `build` reads, for the feature cache's index (`flsuite.data.cache_index`);
        None (the default) where they are not all known (downloads, data shipped in packages): never indexed."""
        return None


class EpochBatches:
    """Pre-sliced in-memory mini-batches for one client's local fit.

    Iterating yields one item per local epoch: the list of (x, y) batches of that epoch, drawn with `generator`.
    Lightning therefore runs one `training_step` per epoch and the client module loops over the batches itself, which
    keeps per-batch framework overhead out of the hot path (docs/performance.md, "Frozen-feature rounds"). With `steps`,
    a single "epoch" of exactly `steps` batches is produced, reshuffling whenever the data runs out.

    With `reuse`, an epoch is a `StreamedEpoch`: each batch is gathered when it is read, into one batch-sized buffer,
    so a batch is overwritten when the next is read. For the lean and compiled loops on the CPU (the lean loop reads
    each batch once and is done with it before the next; the compiled one gathers its runs of full batches by their
    rows inside the scan: `StreamedEpoch.batches`; `RoundServer.train` gives other loops fresh gathers), over a split
    large enough that an epoch's gather costs more than its steps: a batch read while it is in the cache instead of a
    1.3 GB gather an epoch (FKPL's server head: docs/performance.md, "Server fits"). Without `steps` only; the values
    are the same as without it.
    """

    def __init__(
        self,
        split: Split,
        batch_size: int,
        generator: torch.Generator,
        *,
        epochs: int = 1,
        steps: int | None = None,
        drop_last: bool = False,
        reuse: bool = False,
    ) -> None:
        if len(split) == 0:
            raise DataError("cannot train on an empty client split")
        if reuse and steps:
            raise ValueError("EpochBatches(reuse=True) draws whole epochs: it takes `epochs`, not `steps`")
        self.split, self.batch_size, self.generator = split, batch_size, generator
        self.epochs, self.steps, self.drop_last = (1 if steps else epochs), steps, drop_last
        self.reuse = reuse
        self._buffer: torch.Tensor | None = None  # the streamed batches' buffer, with `reuse`

    def __len__(self) -> int:
        return 1

    def fresh(self) -> EpochBatches:
        """These batches (the same split, generator and epochs) with a fresh gather per epoch: for a reader that keeps
        an epoch's batches (the compiled loop stacks them, Lightning moves them), where `reuse` would overwrite them."""
        return EpochBatches(self.split, self.batch_size, self.generator, epochs=self.epochs, drop_last=self.drop_last)

    def _one_pass(self) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        """One shuffled pass: a single gather of the split in the epoch's order, then contiguous views of it (one
        allocation per epoch instead of one per batch; the same values as indexing each batch); with `reuse`, the
        epoch's order streamed one batch at a time."""
        n = len(self.split)
        order = torch.randperm(n, generator=self.generator)
        stop = n - n % self.batch_size if (self.drop_last and n >= self.batch_size) else n
        order = order[:stop]
        if self.reuse:
            if self._buffer is None:
                self._buffer = self.split.x.new_empty((self.batch_size, *self.split.x.shape[1:]))
            return StreamedEpoch(self.split, order.split(self.batch_size), self._buffer)
        x, y = self.split.x[order], self.split.y[order]
        return list(zip(x.split(self.batch_size), y.split(self.batch_size)))

    def epoch(self) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of the next epoch (or the `steps` batches)."""
        if self.steps is None:
            return self._one_pass()
        batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        while len(batches) < self.steps:  # never streamed: `reuse` takes no `steps`
            batches.extend(self._one_pass())
        return batches[: self.steps]

    def __iter__(self) -> Iterator[Sequence[tuple[torch.Tensor, torch.Tensor]]]:
        yield self.epoch()


class StreamedEpoch(Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """One epoch of `EpochBatches(reuse=True)`: batch i is `split`'s rows `batches[i]`, gathered into `buffer` when it
    is read (its labels into a tensor of their own), so reading a batch overwrites the one read before."""

    def __init__(self, split: Split, batches: Sequence[torch.Tensor], buffer: torch.Tensor) -> None:
        self.split, self.batches, self.buffer = split, batches, buffer

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i):
        if not isinstance(i, int):
            raise TypeError("a StreamedEpoch is read one batch at a time (EpochBatches.fresh() keeps whole epochs)")
        rows = self.batches[i]
        x = torch.index_select(self.split.x, 0, rows, out=self.buffer[: len(rows)])
        return x, self.split.y[rows]
