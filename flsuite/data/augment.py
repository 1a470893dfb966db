"""The image path's client data: per-batch augmentation with a seeded stream, and the batches of either local loop.

- `Augment` (the `local.augment` config): random crop with zero padding and horizontal flip, drawn per sample from a
  `torch.Generator`. Written on batched tensors with plain indexing (torchvision.transforms.v2 draws one set of
  parameters per call, i.e. per batch, not per sample).
- `client_batches`: what one client fit iterates. The lean loop gets `EpochBatches` (one item per epoch); the
  standard loop a `DataLoader` yielding one batch per `training_step`, in exactly the lean loop's order (the same
  "batches" stream). Augmentation, when on, draws from the task's "augment" stream (`flsuite.seeding`), so serial and
  Ray runs see the same augmented batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from flsuite.data.base import EpochBatches, Split
from flsuite.seeding import torch_generator

if TYPE_CHECKING:
    from flsuite.federation.task import LocalTraining


@dataclass
class Augment:
    """Per-sample training augmentation of image batches [N, C, H, W] (test data is never augmented).

    Args:
        crop_padding: Random crop of the original size from the image zero-padded by this many pixels on each side
            (the CIFAR recipe: 4); 0: off.
        hflip: Flip each image horizontally with probability 1/2.
    """

    crop_padding: int = 0
    hflip: bool = False

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise ValueError(f"local.augment.crop_padding must be >= 0, got {self.crop_padding}")

    @property
    def enabled(self) -> bool:
        return self.crop_padding > 0 or self.hflip

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The augmented batch (on `x`'s device); the random draws come from the CPU `generator`: first the flips
        [N], then the crop offsets [N, 2]."""
        if not self.enabled:
            return x
        if x.ndim != 4:
            raise ValueError(f"local.augment needs image batches [N, C, H, W], got shape {list(x.shape)}")
        n, _, h, w = x.shape
        if self.hflip:
            flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if self.crop_padding:
            p = self.crop_padding
            offsets = torch.randint(0, 2 * p + 1, (n, 2), generator=generator).to(x.device)
            padded = F.pad(x, (p, p, p, p))
            rows = offsets[:, 0, None] + torch.arange(h, device=x.device)  # [N, H]
            cols = offsets[:, 1, None] + torch.arange(w, device=x.device)  # [N, W]
            batch = torch.arange(n, device=x.device)[:, None, None]
            x = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()  # [N,H,W,C]→
        return x


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

    def __init__(self, n: int, batch_size: int, generator: torch.Generator, *, epochs: int, steps: int | None, drop_last: bool) -> None:
        self._order = EpochBatches(
            Split(torch.arange(n), torch.zeros(n, dtype=torch.long)), batch_size, generator, epochs=epochs, steps=steps, drop_last=drop_last
        )
        self.n, self.batch_size, self.steps, self.drop_last = n, batch_size, steps, drop_last

    @property
    def epochs(self) -> int:
        return self._order.epochs

    def __len__(self) -> int:
        if self.steps:
            return self.steps
        return self.n // self.batch_size if (self.drop_last and self.n >= self.batch_size) else math.ceil(self.n / self.batch_size)

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
        sampler = IndexBatches(len(split), local.batch_size, order, epochs=local.epochs, steps=local.steps, drop_last=local.drop_last)
        loader = DataLoader(SplitBatches(split, local.augment, augment_rng), sampler=sampler, batch_size=None, num_workers=0)
        return loader, sampler.epochs
    batches = EpochBatches(split, local.batch_size, order, epochs=local.epochs, steps=local.steps, drop_last=local.drop_last)
    if local.augment.enabled:
        return AugmentedEpochs(batches, local.augment, augment_rng), batches.epochs
    return batches, batches.epochs
