"""Loaders for torchvision's on-disk dataset formats: MNIST, Fashion-MNIST, SVHN, CIFAR-10/100 and USPS
(``torchvision.datasets``), returned as :class:`~flsuite.data.image_arrays.ImageArrays`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch

from flsuite.data.image_arrays import (
    DIGIT_CLASSES,
    ImageArrays,
    SplitName,
    _check_split,
    _to_arrays,
)

__all__ = ["TorchvisionName", "load_torchvision", "load_usps_torchvision"]

TorchvisionName = Literal["mnist", "svhn", "cifar10", "cifar100", "fashion_mnist"]


def load_usps_torchvision(root: str | Path, split: SplitName, download: bool = False) -> ImageArrays:
    """USPS through ``torchvision.datasets.USPS``: ``<root>/usps.bz2`` (train) or ``usps.t.bz2`` (test).

    Those are the LIBSVM files (bz2 text, ``label idx:value`` x 256 per line, labels 1..10, values
    in [-1, 1]); torchvision maps labels to 0..9 and pixels to ``uint8((v + 1) / 2 * 255)``.
    ``download=True`` fetches them from the LIBSVM site (needs internet).
    """
    split = _check_split(split)
    from torchvision.datasets import USPS

    root = Path(root)
    filename = USPS.split_list[split][1]
    if not download and not (root / filename).is_file():
        raise FileNotFoundError(f"USPS ({split}) not found: {root / filename}; pass download=True to fetch it")
    ds = USPS(str(root), train=split == "train", download=download)
    return _to_arrays(np.asarray(ds.data, dtype=np.uint8), ds.targets, DIGIT_CLASSES)


# --------------------------------------------------------------------------------------------
# torchvision datasets
# --------------------------------------------------------------------------------------------


def load_torchvision(name: TorchvisionName, root: str | Path, split: SplitName, download: bool = False) -> ImageArrays:
    """A torchvision dataset split as uint8 NCHW tensors, from torchvision's on-disk layout under ``root``.

    * ``mnist`` / ``fashion_mnist``: ``<root>/{MNIST,FashionMNIST}/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``
      (all four files must exist); 1x28x28.
    * ``svhn``: ``<root>/{train,test}_32x32.mat`` (md5-checked by torchvision); 3x32x32; digit 0
      is label 0 (the file codes it as 10; torchvision remaps it, and so does this loader).
    * ``cifar10`` / ``cifar100``: ``<root>/cifar-10-batches-py`` / ``<root>/cifar-100-python`` pickles
      (md5-checked); HWC arrays transposed to 3x32x32; CIFAR-100 uses the 100 fine labels.

    ``download=True`` lets torchvision fetch missing files (needs internet). A missing dataset
    raises ``FileNotFoundError``.
    """
    split = _check_split(split)
    from torchvision import datasets as tvd

    train = split == "train"
    root_s = str(root)
    try:
        if name in ("mnist", "fashion_mnist"):
            cls = tvd.MNIST if name == "mnist" else tvd.FashionMNIST
            ds = cls(root_s, train=train, download=download)
            classes = DIGIT_CLASSES if name == "mnist" else tuple(ds.classes)
            return _to_arrays(ds.data.to(torch.uint8), ds.targets, classes)
        if name == "svhn":
            ds = tvd.SVHN(root_s, split=split, download=download)
            labels = np.asarray(ds.labels, dtype=np.int64)
            labels[labels == 10] = 0
            return _to_arrays(np.asarray(ds.data, dtype=np.uint8), labels, DIGIT_CLASSES)
        if name in ("cifar10", "cifar100"):
            cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
            ds = cls(root_s, train=train, download=download)
            data = np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2)  # NHWC -> NCHW
            return _to_arrays(data, ds.targets, tuple(ds.classes))
    except RuntimeError as e:
        if "not found" in str(e).lower():
            raise FileNotFoundError(
                f"torchvision dataset {name!r} ({split}) not found or corrupted under {root}: {e} "
                "(pass download=True to fetch it)"
            ) from e
        raise
    raise ValueError(f"unknown torchvision dataset {name!r}; expected one of {get_args(TorchvisionName)}")
