"""The Benchmark data source: folders → splits → partition → pixels or cached features, with no test leakage."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flsuite.data.base import DataError
from flsuite.data.benchmarks import Benchmark
from flsuite.data.partition import DomainSkew, LabelDomainSkew
from flsuite.models.frozen_encoder import FrozenEncoder

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DOMAINS = {"amazon": "amazon", "caltech": "caltech10", "dslr": "dslr", "webcam": "webcam"}  # canonical → folder


@pytest.fixture(scope="module")
def office_folder(tmp_path_factory) -> Path:
    """A tiny Office-Caltech-10 look-alike: folder names as one real copy spells them, unique random images."""
    from flsuite.data.folder_names import OFFICE_CALTECH10_CLASSES

    root = tmp_path_factory.mktemp("office")
    rng = np.random.default_rng(0)
    for folder in DOMAINS.values():
        for cls in OFFICE_CALTECH10_CLASSES:
            d = root / folder / ("back_pack" if cls == "backpack" else cls)
            d.mkdir(parents=True)
            for i in range(int(rng.integers(6, 12))):
                Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def _rows(x: torch.Tensor) -> set[str]:
    return {hashlib.blake2b(r.numpy().tobytes(), digest_size=16).hexdigest() for r in x}


def test_no_test_image_is_in_any_clients_training_set(office_folder):
    data = Benchmark(
        "office_caltech10", root=office_folder, partition=DomainSkew(clients_per_domain=2), image_size=12
    ).build(seed=0)
    assert len(data.clients) == 8 and list(data.test) == list(DOMAINS)
    train_rows = set().union(*(_rows(c.train.x) for c in data.clients))
    for domain, test in data.test.items():
        assert not (_rows(test.x) & train_rows), f"test images of {domain} leaked into training"
    # complete: with fraction 1 every image is in exactly one of train/test
    n_images = sum(1 for _ in office_folder.rglob("*.png"))
    assert sum(len(c.train) for c in data.clients) + sum(len(t) for t in data.test.values()) == n_images


def test_build_is_deterministic_per_seed(office_folder):
    source = Benchmark("office_caltech10", root=office_folder, partition=DomainSkew(fraction=0.5), image_size=12)
    a, b, c = source.build(1), source.build(1), source.build(2)
    assert all(torch.equal(x.train.x, y.train.x) for x, y in zip(a.clients, b.clients))
    assert not all(
        torch.equal(x.train.y, y.train.y) and len(x.train) == len(y.train) for x, y in zip(a.clients, c.clients)
    )


def test_label_and_domain_skew_partition(office_folder):
    data = Benchmark("office_caltech10", root=office_folder, partition=LabelDomainSkew(beta=0.1), image_size=12).build(
        seed=0
    )
    assert [c.domain for c in data.clients] == list(DOMAINS)
    assert data.class_counts().sum() > 0


class CountingEncoder(FrozenEncoder):
    """A tiny deterministic encoder that counts its forward calls."""

    embed_dim = 4

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 4)
        self.calls = 0
        self._freeze()

    def config_key(self) -> dict[str, str]:
        return {"encoder": "counting"}

    def preprocess(self, images_uint8: torch.Tensor) -> torch.Tensor:
        return images_uint8.float().mean(dim=(2, 3)) / 255.0

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.proj(pixels)


def test_features_are_cached_between_builds(office_folder, tmp_path):
    encoder = CountingEncoder()
    source = Benchmark(
        "office_caltech10", root=office_folder, encoder=encoder, cache_dir=tmp_path / "cache", image_size=12
    )
    first = source.build(seed=0)
    assert encoder.calls > 0 and first.input_shape == (4,)
    calls = encoder.calls
    second = source.build(seed=0)
    assert encoder.calls == calls, "the second build should read every embedding from the cache"
    assert all(torch.equal(a.train.x, b.train.x) for a, b in zip(first.clients, second.clients))
    source.build(seed=1)  # another seed re-splits the same pools: every embedding is already cached
    assert encoder.calls == calls


@pytest.mark.parametrize("kind", ["dangling link", "file", "under a file"])
def test_unusable_cache_dir_stops_before_any_image_is_embedded(office_folder, tmp_path, kind):
    """A dangling `.cache` link (once committed to the repository), a file, or a folder that cannot be created: one
    line naming the path and the fix, and the encoder never ran."""
    if kind == "dangling link":
        cache = tmp_path / "cache"
        cache.symlink_to(tmp_path / "absent" / "folder")
    elif kind == "file":
        cache = tmp_path / "cache"
        cache.write_text("")
    else:
        (tmp_path / "blocker").write_text("")
        cache = tmp_path / "blocker" / "features"
    encoder = CountingEncoder()
    source = Benchmark("office_caltech10", root=office_folder, encoder=encoder, cache_dir=cache, image_size=12)
    with pytest.raises(DataError) as err:
        source.build(seed=0)
    message = str(err.value)
    assert str(cache) in message and "data.init_args.cache_dir" in message and "\n" not in message
    assert {"dangling link": "does not exist", "file": "is a file", "under a file": "cannot be written"}[
        kind
    ] in message
    assert encoder.calls == 0


def test_cache_dir_is_created_where_the_config_says(office_folder, tmp_path):
    cache = tmp_path / "nested" / "features"
    Benchmark("office_caltech10", root=office_folder, encoder=CountingEncoder(), cache_dir=cache, image_size=12).build(
        seed=0
    )
    assert cache.is_dir() and list(cache.glob("*.pt")) and not list(cache.glob(".write-probe.*"))


def test_unknown_suite_and_domain_are_named():
    with pytest.raises(DataError, match="unknown suite 'digitz'"):
        Benchmark("digitz")
    with pytest.raises(DataError, match=r"no domain\(s\) \['mnistt'\]"):
        Benchmark("digits_offline", domains=["mnistt"])


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Benchmark("pacs", root=tmp_path / "nowhere").build(0)


@pytest.mark.skipif(not (SHARED / "usps" / "usps.mat").is_file(), reason="shared USPS file absent")
def test_digits_offline_suite_with_paper_fractions():
    pytest.importorskip("pureml")
    source = Benchmark(
        "digits_offline",
        root=SHARED,
        partition=DomainSkew(fraction=0.1),
        syn_samples=(500, 200),
        max_test_per_domain=300,
    )
    data = source.build(seed=0)
    sizes = {c.domain: len(c.train) for c in data.clients}
    assert sizes["mnist"] == 6000 and sizes["usps"] == 729  # 10% of 60,000 and of 7,291
    assert data.input_shape == (3, 32, 32) and all(len(t) <= 300 for t in data.test.values())


def test_unreadable_image_is_named_or_skipped(office_folder, tmp_path):
    import shutil

    root = tmp_path / "office"
    shutil.copytree(office_folder, root)
    bad = root / "dslr" / "mug" / "broken.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(OSError, match="broken.png"):
        Benchmark("office_caltech10", root=root, image_size=12).build(0)
    data = Benchmark("office_caltech10", root=root, image_size=12, skip_unreadable=True).build(0)
    clean = Benchmark("office_caltech10", root=office_folder, image_size=12).build(0)
    total = lambda d: sum(len(c.train) for c in d.clients) + sum(len(t) for t in d.test.values())  # noqa: E731
    assert total(data) == total(clean)


def test_office_home_classes_come_from_the_folders_and_domain_names_are_mapped(tmp_path):
    rng = np.random.default_rng(1)
    for domain in ("Art", "Clipart", "Product", "Real World"):
        for cls in ("Bike", "Alarm_Clock", "Mug"):
            d = tmp_path / domain / cls
            d.mkdir(parents=True)
            for i in range(5):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    data = Benchmark("office_home", root=tmp_path, image_size=8).build(0)
    assert data.classes == ("Alarm_Clock", "Bike", "Mug")
    assert list(data.test) == ["art", "clipart", "product", "real_world"]
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Benchmark("office_home", root=tmp_path / "nowhere").build(0)


def test_domains_with_different_classes_are_named(tmp_path):
    rng = np.random.default_rng(2)
    for domain, classes in (
        ("Art", ("Bike", "Mug")),
        ("Clipart", ("Bike", "Mug")),
        ("Product", ("Bike", "Pen")),
        ("Real World", ("Bike", "Mug")),
    ):
        for cls in classes:
            d = tmp_path / domain / cls
            d.mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    with pytest.raises(
        DataError, match=r"domain 'product' has classes \['Bike', 'Pen'\], domain 'art' has \['Bike', 'Mug'\]"
    ):
        Benchmark("office_home", root=tmp_path, image_size=8).build(0)
