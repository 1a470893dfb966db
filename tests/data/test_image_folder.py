"""Tests for flsuite.data.image_folder on generated folders, plus the real shared data when present."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flsuite.data import folder_names
from flsuite.data.image_decode import UnreadableImageError
from flsuite.data.image_folder import ImageFileDataset, load_image_folder_arrays, normalise_name, scan_image_folder

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
OFFICE = SHARED_DATA / "office_caltech_10"
PACS = SHARED_DATA / "pacs"

CLASSES = ("backpack", "laptop", "mug")


def _img(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (20, 12), mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, colour)
    (img.convert(mode) if mode != "RGB" else img).save(path)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A small Office-Caltech-like tree with the naming quirks of real copies."""
    root = tmp_path / "office"
    # amazon: Office-31 / FedBN-style class names, mixed case
    _img(root / "Amazon" / "back_pack" / "b.png", (255, 0, 0))
    _img(root / "Amazon" / "back_pack" / "a.PNG", (0, 255, 0))
    _img(root / "Amazon" / "laptop_computer" / "x.jpg", (10, 20, 30), size=(40, 30))
    _img(root / "Amazon" / "Mug" / "sub" / "deep.png", (0, 0, 255))  # nested folder
    _img(root / "Amazon" / "Mug" / "grey.png", (128, 128, 128), mode="L")
    (root / "Amazon" / "Mug" / "notes.txt").write_text("not an image")
    (root / "Amazon" / "Mug" / ".DS_Store").write_bytes(b"\0\1")
    _img(root / "Amazon" / "Mug" / ".hidden.png", (1, 1, 1))
    _img(root / "Amazon" / "Mug" / ".cache" / "c.png", (1, 1, 1))
    _img(root / "Amazon" / "bike" / "z.png", (5, 5, 5))  # a class nobody asked for
    # caltech domain folder named caltech10, class folders with '-' and spaces
    _img(root / "caltech10" / "Back-Pack" / "003_0001.jpg", (200, 100, 50))
    _img(root / "caltech10" / "laptop" / "127_0001.png", (50, 100, 200))
    _img(root / "caltech10" / "laptop" / "127_0002.png", (60, 100, 200))
    _img(root / "caltech10" / "041.coffee-mug" / "041_0001.png", (7, 8, 9))
    (root / ".git").mkdir()
    return root


def scan(root: Path, domains: tuple[str, ...] = ("amazon", "caltech")) -> dict[str, list[tuple[Path, int]]]:
    return scan_image_folder(
        root,
        domains,
        CLASSES,
        folder_names.OFFICE_CALTECH10_DOMAIN_ALIASES,
        folder_names.OFFICE_CALTECH10_CLASS_ALIASES,
    )


def test_normalise_name() -> None:
    assert normalise_name("Art_Painting") == normalise_name("art-painting") == normalise_name("art painting")


def test_scan_resolves_aliases_counts_and_order(tree: Path) -> None:
    res = scan(tree)
    assert list(res) == ["amazon", "caltech"]
    amazon = [(p.relative_to(tree).as_posix(), y) for p, y in res["amazon"]]
    assert amazon == [
        ("Amazon/back_pack/a.PNG", 0),
        ("Amazon/back_pack/b.png", 0),
        ("Amazon/laptop_computer/x.jpg", 1),
        ("Amazon/Mug/grey.png", 2),
        ("Amazon/Mug/sub/deep.png", 2),
    ]
    caltech = [(p.relative_to(tree).as_posix(), y) for p, y in res["caltech"]]
    assert caltech == [
        ("caltech10/Back-Pack/003_0001.jpg", 0),
        ("caltech10/laptop/127_0001.png", 1),
        ("caltech10/laptop/127_0002.png", 1),
        ("caltech10/041.coffee-mug/041_0001.png", 2),
    ]


def test_scan_without_aliases_fails_on_renamed_folders(tree: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        scan_image_folder(tree, ["caltech"], CLASSES)
    msg = str(err.value)
    assert "'caltech'" in msg and "caltech10" in msg and "Amazon" in msg  # names it and lists what exists


def test_missing_class_folder_names_it(tree: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        scan_image_folder(
            tree, ["amazon"], ["backpack", "projector"], class_aliases=folder_names.OFFICE_CALTECH10_CLASS_ALIASES
        )
    msg = str(err.value)
    assert "'projector'" in msg and "video_projector" in msg and "laptop_computer" in msg and "amazon" in msg.lower()


def test_missing_domain_and_root(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="'webcam'"):
        scan(tree, ("amazon", "webcam"))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        scan(tmp_path / "nowhere")


def test_ambiguous_and_colliding_names(tmp_path: Path) -> None:
    _img(tmp_path / "d" / "Back-Pack" / "a.png", (0, 0, 0))
    _img(tmp_path / "d" / "back pack" / "b.png", (0, 0, 0))
    with pytest.raises(ValueError, match="several folders"):
        scan_image_folder(tmp_path, ["d"], ["backpack"])
    with pytest.raises(ValueError, match="both resolve"):
        scan_image_folder(tmp_path, ["d"], ["Back-Pack", "bag"], class_aliases={"bag": ["Back-Pack"]})


def test_image_file_dataset_items(tree: Path) -> None:
    entries = scan(tree)["amazon"]
    ds = ImageFileDataset(entries, size=(8, 10))
    assert len(ds) == 5 and ds.targets == [0, 0, 1, 2, 2]
    x, y = ds[1]
    assert x.dtype == torch.uint8 and x.shape == (3, 8, 10) and y == 0
    assert x[:, 0, 0].tolist() == [255, 0, 0]  # b.png is pure red
    grey, _ = ds[3]
    assert grey.shape == (3, 8, 10) and grey[:, 0, 0].tolist() == [128, 128, 128]  # L -> RGB
    native, _ = ImageFileDataset(entries)[0]
    assert native.shape == (3, 12, 20)  # no size: original resolution (W=20, H=12)
    size_seen, _ = ImageFileDataset(entries, transform=lambda im: im.size)[2]
    assert size_seen == (40, 30)


def test_load_arrays_matches_dataset_and_is_ordered(tree: Path) -> None:
    entries = [e for d in scan(tree).values() for e in d]
    arr = load_image_folder_arrays(entries, 16, classes=CLASSES, num_workers=2)
    assert arr.x.shape == (9, 3, 16, 16) and arr.y.tolist() == [y for _, y in entries] and arr.classes == CLASSES
    ds = ImageFileDataset(entries, size=16)
    assert all(torch.equal(arr.x[i], ds[i][0]) for i in range(len(ds)))
    single = load_image_folder_arrays(entries, 16, classes=CLASSES, num_workers=1)
    assert torch.equal(single.x, arr.x)
    assert load_image_folder_arrays(entries[:2], 4).classes == ("0",)


def test_corrupt_image_is_named_or_skipped(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tree / "Amazon" / "laptop_computer" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    entries = scan(tree)["amazon"]
    assert any(p == bad for p, _ in entries)
    idx = [p for p, _ in entries].index(bad)
    with pytest.raises(UnreadableImageError, match=r"broken\.jpg"):
        ImageFileDataset(entries, size=8)[idx]
    with pytest.raises(UnreadableImageError, match=r"broken\.jpg"):
        load_image_folder_arrays(entries, 8)
    with caplog.at_level(logging.WARNING, logger="flsuite.data.image_folder"):
        arr = load_image_folder_arrays(entries, 8, skip_unreadable=True)
        ds = ImageFileDataset(entries, size=8, skip_unreadable=True)
    assert len(arr) == len(entries) - 1 and len(ds) == len(entries) - 1
    assert arr.y.tolist() == [y for p, y in entries if p != bad]
    assert sum("skipped 1 unreadable" in r.getMessage() for r in caplog.records) == 2


def test_module_constants_consistent() -> None:
    for domains, classes, d_alias, c_alias in [
        (
            folder_names.OFFICE_CALTECH10_DOMAINS,
            folder_names.OFFICE_CALTECH10_CLASSES,
            folder_names.OFFICE_CALTECH10_DOMAIN_ALIASES,
            folder_names.OFFICE_CALTECH10_CLASS_ALIASES,
        ),
        (
            folder_names.PACS_DOMAINS,
            folder_names.PACS_CLASSES,
            folder_names.PACS_DOMAIN_ALIASES,
            folder_names.PACS_CLASS_ALIASES,
        ),
    ]:
        assert set(d_alias) <= set(domains) and set(c_alias) <= set(classes)
        assert len(set(domains)) == len(domains) and len(set(classes)) == len(classes)
    assert len(folder_names.OFFICE_CALTECH10_CLASSES) == 10 and len(folder_names.PACS_CLASSES) == 7


# ---------------------------------------------------------------------------------------------
# real data in ../shared/data (skipped when absent)
# ---------------------------------------------------------------------------------------------

OFFICE_COUNTS = {  # per class, in OFFICE_CALTECH10_CLASSES order (shared/data/office_caltech_10/SOURCE.md)
    "amazon": [92, 82, 94, 99, 100, 100, 99, 100, 94, 98],
    "caltech": [151, 110, 100, 138, 85, 128, 133, 94, 87, 97],
    "dslr": [12, 21, 12, 13, 10, 24, 22, 12, 8, 23],
    "webcam": [29, 21, 31, 27, 27, 30, 43, 30, 27, 30],
}
PACS_COUNTS = {  # per class, in PACS_CLASSES order (shared/data/pacs/SOURCE.md, the 65 % subset)
    "photo": [123, 131, 118, 121, 129, 182, 281],
    "art_painting": [246, 166, 185, 120, 131, 192, 292],
    "cartoon": [253, 297, 225, 88, 211, 187, 263],
    "sketch": [502, 481, 489, 395, 530, 52, 104],
}


@pytest.mark.skipif(not OFFICE.is_dir(), reason=f"shared data not present: {OFFICE}")
def test_office_caltech10_real() -> None:
    res = scan_image_folder(
        OFFICE,
        folder_names.OFFICE_CALTECH10_DOMAINS,
        folder_names.OFFICE_CALTECH10_CLASSES,
        folder_names.OFFICE_CALTECH10_DOMAIN_ALIASES,
        folder_names.OFFICE_CALTECH10_CLASS_ALIASES,
    )
    counts = {d: np.bincount([y for _, y in e], minlength=10).tolist() for d, e in res.items()}
    assert counts == OFFICE_COUNTS
    assert sum(len(e) for e in res.values()) == 2533
    # webcam in full (variable-size photos) plus caltech's 4 greyscale images
    grey = [e for e in res["caltech"] if e[0].name in {"101_0069.jpg", "045_0053.jpg", "127_0058.jpg", "127_0103.jpg"}]
    assert len(grey) == 4
    arr = load_image_folder_arrays(res["webcam"] + grey, 32, classes=folder_names.OFFICE_CALTECH10_CLASSES)
    assert arr.x.shape == (299, 3, 32, 32) and arr.y[-4:].tolist() == [y for _, y in grey]
    assert float(arr.x.float().std()) > 20  # real photos, not blank


@pytest.mark.skipif(not PACS.is_dir(), reason=f"shared data not present: {PACS}")
def test_pacs_real() -> None:
    res = scan_image_folder(
        PACS,
        folder_names.PACS_DOMAINS,
        folder_names.PACS_CLASSES,
        folder_names.PACS_DOMAIN_ALIASES,
        folder_names.PACS_CLASS_ALIASES,
    )
    counts = {d: np.bincount([y for _, y in e], minlength=7).tolist() for d, e in res.items()}
    assert counts == PACS_COUNTS
    assert sum(len(e) for e in res.values()) == 6494
    assert all(p.suffix == ".png" for p, _ in res["sketch"]) and all(p.suffix == ".jpg" for p, _ in res["photo"])
    some = res["sketch"][::500] + res["art_painting"][::500]
    arr = load_image_folder_arrays(some, 64, classes=folder_names.PACS_CLASSES)
    assert arr.x.shape == (len(some), 3, 64, 64)
    assert ImageFileDataset(res["photo"][:1])[0][0].shape == (3, 227, 227)
