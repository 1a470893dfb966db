"""What one client fit iterates under each local loop. The lean loop gets `EpochBatches` (one item per epoch); the
standard loop a `DataLoader` yielding one batch per `training_step`, in exactly the lean loop's order (the same
"batches" stream). Augmentation (`local.augment`), when on, draws from the task's "augment" stream
(`flsuite.seeding`), so serial and Ray runs see the same augmented batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from flsuite.data.augment import Augment
from flsuite.data.base import EpochBatches, Split
from flsuite.federation.task import LocalTraining
from flsuite.seeding import torch_generator


class AugmentedEpochs:
    """`EpochBatches` whose batches are augmented as each epoch is produced (the lean loop)."""

    def __init__(self, batches: EpochBatches, augment: Augment, generator: torch.Generator) -> None:
        self.batches, self.augment, self.generator = batches, augment, generator

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        for epoch in self.batches:
            yield [(self.augment(x, self.generator), y) for x, y in epoch]


class IndexBatches:
    """A batch sampler with exactly `EpochBatches`' order: each iteration is one epoch of index tensors (or the
    `steps` batches), drawn from `generator` the same way."""

    def __init__(
        self, n: int, batch_size: int, generator: torch.Generator, *, epochs: int, steps: int | None, drop_last: bool
    ) -> None:
        self._order = EpochBatches(
            Split(torch.arange(n), torch.zeros(n, dtype=torch.long)),
            batch_size,
            generator,
            epochs=epochs,
            steps=steps,
            drop_last=drop_last,
        )
        self.n, self.batch_size, self.steps, self.drop_last = n, batch_size, steps, drop_last

    @property
    def epochs(self) -> int:
        return self._order.epochs

    def __len__(self) -> int:
        if self.steps:
            return self.steps
        return (
            self.n // self.batch_size
            if (self.drop_last and self.n >= self.batch_size)
            else math.ceil(self.n / self.batch_size)
        )

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index, _ in self._order.epoch():
            yield index


class SplitBatches(Dataset):
    """A split indexed by a whole batch of indices at once (no per-sample fetch and collate), augmented on read."""

    def __init__(self, split: Split, augment: Augment, generator: torch.Generator) -> None:
        self.split, self.augment, self.generator = split, augment, generator

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.augment(self.split.x[index], self.generator), self.split.y[index]


def client_batches(split: Split, local: LocalTraining, seed: int) -> tuple[Iterable, int]:
    """(what `Trainer.fit` iterates, its number of epochs) for one client fit under `local.loop`, with batch order
    and augmentation drawn from the task seed's "batches" and "augment" streams."""
    order, augment_rng = torch_generator(seed, purpose="batches"), torch_generator(seed, purpose="augment")
    if local.loop == "standard":
        sampler = IndexBatches(
            len(split), local.batch_size, order, epochs=local.epochs, steps=local.steps, drop_last=local.drop_last
        )
        loader = DataLoader(
            SplitBatches(split, local.augment, augment_rng), sampler=sampler, batch_size=None, num_workers=0
        )
        return loader, sampler.epochs
    batches = EpochBatches(
        split, local.batch_size, order, epochs=local.epochs, steps=local.steps, drop_last=local.drop_last
    )
    if local.augment.enabled:
        return AugmentedEpochs(batches, local.augment, augment_rng), batches.epochs
    return batches, batches.epochs
