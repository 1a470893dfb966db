"""Decoding one image file: :func:`load_image` (RGB PIL image, optionally resized) and the
:class:`UnreadableImageError` it raises, plus the size/tensor/verify helpers the ImageFolder loaders share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["UnreadableImageError", "load_image"]

Size = int | tuple[int, int]


class UnreadableImageError(OSError):
    """An image file could not be opened or decoded; the message names the file."""


def _hw(size: Size) -> tuple[int, int]:
    h, w = (size, size) if isinstance(size, int) else size
    if h <= 0 or w <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return int(h), int(w)


def load_image(path: str | Path, size: Size | None = None) -> Image.Image:
    """Decode ``path`` as an RGB PIL image, resized to ``size`` (int or (height, width)) if given.

    Resizing squashes to the exact size (no crop), bilinear with antialiasing. JPEGs are decoded
    at a reduced DCT scale first (``Image.draft``) when that still leaves at least ``size``
    pixels, which makes large photos (e.g. 1000x1000 DSLR images) much faster to load.
    Any failure raises :class:`UnreadableImageError` naming the file.
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            if size is not None and im.format == "JPEG":
                h, w = _hw(size)
                im.draft("RGB", (w, h))
            rgb = im.convert("RGB")  # forces the decode
        if size is not None:
            h, w = _hw(size)
            if rgb.size != (w, h):
                rgb = rgb.resize((w, h), Image.Resampling.BILINEAR)
        return rgb
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise UnreadableImageError(f"cannot read image {path}: {e}") from e


def _to_chw_uint8(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def _verifies(path: Path) -> bool:
    try:
        with Image.open(path) as im:
            im.verify()
        return True
    except Exception:  # noqa: BLE001 - PIL raises many exception types for damaged files
        return False
