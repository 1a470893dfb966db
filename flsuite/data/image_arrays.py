"""The in-memory image split every raw loader returns (:class:`ImageArrays`: uint8 ``[N, C, H, W]`` images,
int64 labels, class names), the digit and Fashion-MNIST class names, and the split/array helpers the loaders share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

__all__ = ["DIGIT_CLASSES", "FASHION_MNIST_CLASSES", "ImageArrays", "SplitName"]

SplitName = Literal["train", "test"]

DIGIT_CLASSES: tuple[str, ...] = tuple(str(i) for i in range(10))
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


@dataclass(frozen=True, eq=False)
class ImageArrays:
    """A split of an image dataset held in memory: x uint8 [N, C, H, W] (C = 1 or 3), y int64 [N].

    ``classes[k]`` is the name of label ``k``; every label lies in ``[0, len(classes))``.
    (``eq=False``: comparing tensors field-wise has no single truth value; compare ``x``/``y``
    explicitly, e.g. with ``torch.equal``.)
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.x, torch.Tensor) or not isinstance(self.y, torch.Tensor):
            raise ValueError(
                f"ImageArrays: x and y must be torch.Tensor, got {type(self.x).__name__} and {type(self.y).__name__}"
            )
        if self.x.dtype != torch.uint8:
            raise ValueError(f"ImageArrays: x must be uint8, got {self.x.dtype}")
        if self.x.ndim != 4 or self.x.shape[1] not in (1, 3):
            raise ValueError(f"ImageArrays: x must have shape [N, C, H, W] with C in (1, 3), got {tuple(self.x.shape)}")
        if self.y.dtype != torch.int64:
            raise ValueError(f"ImageArrays: y must be int64, got {self.y.dtype}")
        if self.y.ndim != 1 or self.y.shape[0] != self.x.shape[0]:
            raise ValueError(
                f"ImageArrays: y must have shape [N] with N = {self.x.shape[0]} (from x), got {tuple(self.y.shape)}"
            )
        classes = tuple(self.classes)
        if not classes or not all(isinstance(c, str) for c in classes):
            raise ValueError(f"ImageArrays: classes must be a non-empty sequence of str, got {self.classes!r}")
        object.__setattr__(self, "classes", classes)
        if self.y.numel() > 0:
            lo, hi = int(self.y.min()), int(self.y.max())
            if lo < 0 or hi >= len(classes):
                raise ValueError(
                    f"ImageArrays: labels must lie in [0, {len(classes)}) for {len(classes)} classes, "
                    f"got range [{lo}, {hi}]"
                )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(self, index: torch.Tensor | np.ndarray | Sequence[int]) -> ImageArrays:
        """Rows ``index`` (any 1-D integer index) as a new ImageArrays with the same classes."""
        idx = torch.as_tensor(np.asarray(index), dtype=torch.long)
        return ImageArrays(x=self.x[idx], y=self.y[idx], classes=self.classes)


def _check_split(split: str) -> SplitName:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split  # type: ignore[return-value]


def _to_arrays(x: np.ndarray | torch.Tensor, y: Any, classes: Sequence[str]) -> ImageArrays:
    """Build ImageArrays from [N, H, W] (grey) or [N, C, H, W] uint8 data and any 1-D labels."""
    xt = torch.as_tensor(np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x)
    if xt.ndim == 3:
        xt = xt.unsqueeze(1)
    yt = torch.as_tensor(np.asarray(y).reshape(-1).astype(np.int64))
    return ImageArrays(x=xt.contiguous(), y=yt, classes=tuple(classes))
