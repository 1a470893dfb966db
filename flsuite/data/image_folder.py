"""Multi-domain ImageFolder loading: ``<root>/<domain>/<class>/<image>`` (PACS, Office-Caltech-10, ...).

Copies of the same dataset disagree on folder names (Office-Caltech's ``caltech`` vs ``caltech10``,
``backpack`` vs ``back_pack``, PACS's ``art_painting`` vs ``art``). Callers therefore ask for
*canonical* domain/class names, and :func:`scan_image_folder` resolves each to the folder that
is actually there: an exact name first, then a match after normalisation (lower case, ``_``,
``-`` and spaces removed), trying the canonical name and then its aliases.

Unreadable images: :class:`ImageFileDataset` (lazy) raises :class:`UnreadableImageError` naming
the file when an item fails to decode; with ``skip_unreadable=True`` it runs PIL's cheap
``verify()`` on every file when constructed and drops the ones that fail (header/CRC-level
damage; a truncated JPEG body can still pass and then raises when loaded).
:func:`load_image_folder_arrays` decodes every file anyway, so its ``skip_unreadable=True`` drops
exactly the files that fail to decode. Skips are logged as one warning with a count.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from flsuite import progress
from flsuite.data.image_arrays import ImageArrays
from flsuite.data.image_decode import (
    Size,
    UnreadableImageError,
    _hw,
    _to_chw_uint8,
    _verifies,
    load_image,
)

__all__ = [
    "IMAGE_EXTENSIONS",
    "Entry",
    "ImageFileDataset",
    "load_image_folder_arrays",
    "normalise_name",
    "resolve_dir",
    "scan_image_folder",
]

logger = logging.getLogger(__name__)

Entry = tuple[Path, int]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)


def normalise_name(name: str) -> str:
    """Folder-name normal form used for matching: lower case without ``_``, ``-`` and whitespace."""
    return "".join(ch for ch in name.lower() if ch not in "_-" and not ch.isspace())


def _visible_subdirs(parent: Path) -> list[Path]:
    return sorted(d for d in parent.iterdir() if d.is_dir() and not d.name.startswith("."))


def resolve_dir(parent: Path, canonical: str, aliases: Sequence[str], kind: str) -> Path:
    """The sub-folder of `parent` for a canonical name: exact name, then normalised name, then each alias."""
    subdirs = _visible_subdirs(parent)
    names = [canonical, *aliases]
    by_name = {d.name: d for d in subdirs}
    for name in names:
        if name in by_name:
            return by_name[name]
    wanted = {normalise_name(n) for n in names}
    matches = [d for d in subdirs if normalise_name(d.name) in wanted]
    if len(matches) == 1:
        return matches[0]
    found = [d.name for d in subdirs]
    if matches:
        raise ValueError(
            f"{kind} {canonical!r}: several folders in {parent} match {names}: {[d.name for d in matches]}"
        )
    raise FileNotFoundError(
        f"{kind} folder for {canonical!r} not found in {parent} "
        f"(tried {names}, also after normalising case/'_'/'-'/spaces); folders found: {found}"
    )


def _list_images(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively), skipping hidden files/folders; sorted by relative path."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                files.append(Path(dirpath, name))
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def scan_image_folder(
    root: str | Path,
    domains: Sequence[str],
    classes: Sequence[str],
    domain_aliases: Mapping[str, Sequence[str]] | None = None,
    class_aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[Entry]]:
    """Map each canonical domain to its sorted ``(image path, class index)`` entries.

    ``class index`` is the position in ``classes``. Folder names are resolved per domain as the
    module docstring describes; a missing domain/class folder raises ``FileNotFoundError`` naming
    it and listing the folders found. Only files with an image extension (:data:`IMAGE_EXTENSIONS`,
    any case) count; hidden files and folders are ignored; class folders are searched
    recursively. Entries are ordered by class index, then relative path. Folders that match no
    requested class are ignored (logged at debug level).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder root not found: {root}")
    if len(set(domains)) != len(domains) or len(set(classes)) != len(classes):
        raise ValueError(f"domains and classes must not repeat: {list(domains)}, {list(classes)}")
    domain_aliases = domain_aliases or {}
    class_aliases = class_aliases or {}
    result: dict[str, list[Entry]] = {}
    for domain in domains:
        ddir = resolve_dir(root, domain, tuple(domain_aliases.get(domain, ())), "domain")
        entries: list[Entry] = []
        used: dict[Path, str] = {}
        for label, cls in enumerate(classes):
            cdir = resolve_dir(ddir, cls, tuple(class_aliases.get(cls, ())), f"class (domain {domain!r})")
            if cdir in used:
                raise ValueError(f"classes {used[cdir]!r} and {cls!r} both resolve to folder {cdir}")
            used[cdir] = cls
            files = _list_images(cdir)
            if not files:
                logger.warning("image folder %s (domain %r, class %r) holds no images", cdir, domain, cls)
            entries.extend((p, label) for p in files)
        unused = sorted(d.name for d in _visible_subdirs(ddir) if d not in used)
        if unused:
            logger.debug("domain %r (%s): ignoring folders %s", domain, ddir, unused)
        result[domain] = entries
    return result


class ImageFileDataset(Dataset[tuple[Any, int]]):
    """Lazily loads ``(path, label)`` entries as RGB images.

    Items are ``(uint8 CHW tensor, label)``, or ``(transform(pil_image), label)`` when
    ``transform`` is given (``size`` resizing happens first). With ``skip_unreadable=True``, files
    that fail PIL's ``verify()`` are dropped at construction (see the module docstring).
    """

    def __init__(
        self,
        entries: Iterable[Entry],
        size: Size | None = None,
        transform: Callable[[Image.Image], Any] | None = None,
        skip_unreadable: bool = False,
    ) -> None:
        self.entries: list[Entry] = [(Path(p), int(y)) for p, y in entries]
        self.size = None if size is None else _hw(size)
        self.transform = transform
        if skip_unreadable:
            ok = [_verifies(p) for p, _ in self.entries]
            bad = [str(p) for (p, _), good in zip(self.entries, ok, strict=True) if not good]
            if bad:
                logger.warning("ImageFileDataset: skipped %d unreadable image(s), e.g. %s", len(bad), bad[:3])
            self.entries = [e for e, good in zip(self.entries, ok, strict=True) if good]

    @property
    def targets(self) -> list[int]:
        return [y for _, y in self.entries]

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.entries[index]
        img = load_image(path, self.size)
        if self.transform is not None:
            return self.transform(img), label
        return _to_chw_uint8(img), label


def _common_folder(entries: Sequence[tuple[Path, int]]) -> str:
    """The name of the folder that holds every entry (a domain's root), for the decoding bar; "" if there is none."""
    try:
        return Path(os.path.commonpath([p.parent for p, _ in entries])).name if entries else ""
    except ValueError:  # absolute and relative paths mixed
        return ""


def load_image_folder_arrays(
    entries: Sequence[Entry],
    size: Size,
    classes: Sequence[str] | None = None,
    skip_unreadable: bool = False,
    num_workers: int | None = None,
) -> ImageArrays:
    """Decode all ``entries`` into memory as uint8 ``[N, 3, H, W]`` at a fixed ``size``.

    Meant for small sets (Office-Caltech-10: 2,533 images load in a few seconds on 2 cores).
    Decoding runs in a thread pool (PIL releases the GIL); output order equals ``entries`` order
    (minus skipped files). ``classes`` names the labels (default ``"0"``, ``"1"``, ...).
    An unreadable file raises :class:`UnreadableImageError`, or is dropped (one warning with the
    count) if ``skip_unreadable``.
    """
    h, w = _hw(size)
    entries = [(Path(p), int(y)) for p, y in entries]
    if classes is None:
        if not entries:
            raise ValueError("load_image_folder_arrays: no entries and no classes given")
        classes = tuple(str(i) for i in range(max(y for _, y in entries) + 1))
    workers = num_workers if num_workers is not None else min(8, os.cpu_count() or 1)

    x = np.empty((len(entries), 3, h, w), dtype=np.uint8)

    def decode(i: int) -> bool:
        try:
            x[i] = np.asarray(load_image(entries[i][0], (h, w)), dtype=np.uint8).transpose(2, 0, 1)
        except UnreadableImageError:
            if skip_unreadable:
                return False
            raise
        return True

    desc = f"decode {_common_folder(entries)}".strip()
    if workers > 1 and len(entries) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            ok = list(progress.track(pool.map(decode, range(len(entries))), desc, "img", total=len(entries)))
    else:
        ok = [decode(i) for i in progress.track(range(len(entries)), desc, "img")]
    skipped = [str(p) for (p, _), good in zip(entries, ok, strict=True) if not good]
    if skipped:
        logger.warning("load_image_folder_arrays: skipped %d unreadable image(s), e.g. %s", len(skipped), skipped[:3])
        x = x[np.flatnonzero(ok)]
    y = torch.tensor([lab for (_, lab), good in zip(entries, ok, strict=True) if good], dtype=torch.int64)
    return ImageArrays(x=torch.from_numpy(x), y=y, classes=tuple(classes))
