"""SYN-style synthetic digits rendered from TrueType fonts (in the spirit of SynDigits).

Ganin & Lempitsky (ICML 2015) built "Synthetic Digits" by rendering house-number-like strings with
many Windows fonts, random position/orientation/stroke/colours and blur, to mimic SVHN. The real
set is not available offline, so :func:`render_syn_digits` re-creates that kind of data from
TrueType fonts. It is a stand-in with the same character (coloured, font-varied, lightly
distorted digits, neighbouring digits as distractors), not a copy of the published images.

Decision: by default the fonts are the ones matplotlib's wheel ships (DejaVu, STIX, Computer Modern), not the
machine's: the rendered set, and every number trained on it, is then the same on every machine with the same
matplotlib release. The machine's fonts (``fc-list``) only on request
(``digit_fonts.discover_fonts(include_system=True)``, passed as ``fonts``); installing a font package once changed a
committed FedEGG run here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from flsuite import progress
from flsuite.data.digit_fonts import discover_fonts
from flsuite.data.image_arrays import DIGIT_CLASSES, ImageArrays

__all__ = ["render_syn_digits"]

logger = logging.getLogger(__name__)

_MIN_LUMA_CONTRAST = 70.0  # |luma(fg) - luma(bg)| on 0..255, against both gradient end colours


def _luma(rgb: np.ndarray) -> np.ndarray:
    luma: np.ndarray = rgb @ np.array([0.299, 0.587, 0.114])
    return luma


@functools.lru_cache(maxsize=4096)
def _font(path: str, px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, px)


def _render_mask(
    size: int,
    font: ImageFont.FreeTypeFont,
    digit: str,
    left: str | None,
    right: str | None,
    gap: float,
    center: tuple[float, float],
    affine: tuple[float, float, float, float],
    blur: float,
) -> np.ndarray:
    """Ink coverage (uint8 [size, size]) of the digit (plus neighbours) after an affine warp."""
    pad = size // 2  # draw on a bigger canvas so rotated neighbours are not clipped
    canvas = size + 2 * pad
    mask = Image.new("L", (canvas, canvas), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy = center[0] + pad, center[1] + pad
    draw.text((cx, cy), digit, fill=255, font=font, anchor="mm")
    half = font.getlength(digit) / 2
    if left is not None:
        draw.text((cx - half - gap, cy), left, fill=255, font=font, anchor="rm")
    if right is not None:
        draw.text((cx + half + gap, cy), right, fill=255, font=font, anchor="lm")
    # Inverse affine about the digit centre: input = A^-1 (output - c) + c; output is the
    # size x size window starting at (pad, pad) of the canvas.
    a, b, c, d = affine
    det = a * d - b * c
    ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
    ox, oy = center  # centre in output coordinates
    coeffs = (ia, ib, cx - ia * ox - ib * oy, ic, id_, cy - ic * ox - id_ * oy)
    out = mask.transform((size, size), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    if blur > 0:
        out = out.filter(ImageFilter.GaussianBlur(blur))
    return np.asarray(out, dtype=np.uint8)


def _sample_colours(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Background gradient end colours and a foreground colour per sample, with luma contrast."""
    bg1 = rng.uniform(0, 255, size=(n, 3))
    bg2 = np.clip(bg1 + rng.uniform(-50, 50, size=(n, 3)), 0, 255)
    fg = rng.uniform(0, 255, size=(n, 3))
    for _ in range(1000):
        bad = np.minimum(np.abs(_luma(fg) - _luma(bg1)), np.abs(_luma(fg) - _luma(bg2))) < _MIN_LUMA_CONTRAST
        if not bad.any():
            return bg1, bg2, fg
        fg[bad] = rng.uniform(0, 255, size=(int(bad.sum()), 3))
    # Mid-grey backgrounds can make rejection slow; fall back to black or white ink.
    fg[bad] = np.where(_luma(bg1[bad])[:, None] > 127.5, 0.0, 255.0)
    return bg1, bg2, fg


def render_syn_digits(n: int, seed: int, size: int = 32, fonts: Sequence[str | Path] | None = None) -> ImageArrays:
    """Render ``n`` SYN-style RGB digit images (uint8 ``[n, 3, size, size]``), deterministic in ``seed``.

    Generation procedure (all randomness from ``numpy.random.default_rng(seed)``, drawn up front):

    1. labels: ``rng.permutation(arange(n) % 10)`` (classes as balanced as ``n`` allows);
    2. font: uniform over ``fonts`` (``None`` -> :func:`discover_fonts`: matplotlib's fonts, the same list on
       every machine with the same matplotlib); font size (em) 50-90 % of ``size``;
    3. neighbours: with probability 0.5 each, a random digit left and/or right of the labelled
       centre digit, a small gap apart (mostly cut off by the frame, as in SVHN/SynDigits);
    4. placement: centre jittered by up to +-12 % of ``size``; affine warp about that centre with
       rotation +-15 deg, scale 0.8-1.15, horizontal shear +-0.2;
    5. colours: background = linear gradient between two nearby random colours in a random
       direction; foreground = random colour re-drawn until its luma differs by >= 70/255 from
       both gradient ends; the glyph coverage mask blends them;
    6. degradations: Gaussian blur (radius 0.3-1.2 px) with probability 0.5, then Gaussian pixel
       noise with sigma 0-6 grey levels; rounding to uint8.

    Throughput: about 4,000 images/s at 32x32 on one CPU core (n=10,000 in ~2.5 s; PIL text
    drawing and warping per image, colour compositing vectorised in numpy).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if size < 8:
        raise ValueError(f"size must be >= 8 pixels, got {size}")
    font_paths = [str(p) for p in (discover_fonts() if fonts is None else fonts)]
    if not font_paths:
        raise FileNotFoundError(
            "render_syn_digits: no usable TrueType font found (looked via fc-list, /usr/share/fonts and "
            "matplotlib's bundled fonts); install e.g. the Debian package 'fonts-dejavu-core' or pass fonts="
        )
    for p in font_paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"render_syn_digits: font file not found: {p}")

    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 10)
    font_idx = rng.integers(0, len(font_paths), size=n)
    px = np.maximum(6, np.rint(rng.uniform(0.5, 0.9, size=n) * size)).astype(int)
    left = np.where(rng.random(n) < 0.5, rng.integers(0, 10, size=n), -1)
    right = np.where(rng.random(n) < 0.5, rng.integers(0, 10, size=n), -1)
    gap = rng.uniform(0.0, 0.12, size=n) * px
    centre = size / 2 + rng.uniform(-0.12, 0.12, size=(n, 2)) * size
    angle = np.deg2rad(rng.uniform(-15, 15, size=n))
    scale = rng.uniform(0.8, 1.15, size=n)
    shear = rng.uniform(-0.2, 0.2, size=n)
    blur = np.where(rng.random(n) < 0.5, rng.uniform(0.3, 1.2, size=n), 0.0)
    bg1, bg2, fg = _sample_colours(rng, n)
    grad_angle = rng.uniform(0, 2 * np.pi, size=n)
    noise_sigma = rng.uniform(0, 6, size=n)
    noise_seed = int(rng.integers(0, 2**63 - 1))

    masks = np.empty((n, size, size), dtype=np.uint8)
    for i in progress.track(range(n), "render SYN digits", "img"):  # seconds for a benchmark's 34,000
        cos, sin = np.cos(angle[i]) * scale[i], np.sin(angle[i]) * scale[i]
        # forward map = rotation*scale @ shear ([[1, s], [0, 1]])
        affine = (cos, cos * shear[i] - sin, sin, sin * shear[i] + cos)
        masks[i] = _render_mask(
            size,
            _font(font_paths[font_idx[i]], int(px[i])),
            DIGIT_CLASSES[labels[i]],
            DIGIT_CLASSES[left[i]] if left[i] >= 0 else None,
            DIGIT_CLASSES[right[i]] if right[i] >= 0 else None,
            float(gap[i]),
            (float(centre[i, 0]), float(centre[i, 1])),
            affine,
            float(blur[i]),
        )

    x = torch.from_numpy(_composite(masks, bg1, bg2, fg, grad_angle, noise_sigma, noise_seed))
    return ImageArrays(x=x, y=torch.from_numpy(labels.astype(np.int64)), classes=DIGIT_CLASSES)


def _composite(
    masks: np.ndarray,
    bg1: np.ndarray,
    bg2: np.ndarray,
    fg: np.ndarray,
    grad_angle: np.ndarray,
    noise_sigma: np.ndarray,
    noise_seed: int,
    chunk: int = 1024,
) -> np.ndarray:
    """Blend colours through the masks in chunks (bounded memory); returns uint8 [n, 3, H, W]."""
    n, h, w = masks.shape
    out = np.empty((n, 3, h, w), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy, xx = yy / max(h - 1, 1) - 0.5, xx / max(w - 1, 1) - 0.5
    noise_rng = np.random.default_rng(noise_seed)
    bg1, bg2, fg = (a.astype(np.float32) for a in (bg1, bg2, fg))
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        proj = np.cos(grad_angle[s:e, None, None]) * xx + np.sin(grad_angle[s:e, None, None]) * yy
        t = (proj - proj.min(axis=(1, 2), keepdims=True)) / np.ptp(proj, axis=(1, 2), keepdims=True).clip(1e-6)
        t = t[:, None].astype(np.float32)  # [b, 1, H, W] in 0..1
        bg = bg1[s:e, :, None, None] + (bg2 - bg1)[s:e, :, None, None] * t
        m = masks[s:e, None].astype(np.float32) / 255.0
        img = bg * (1.0 - m) + fg[s:e, :, None, None] * m
        img += noise_rng.standard_normal(img.shape, dtype=np.float32) * noise_sigma[s:e, None, None, None]
        out[s:e] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out
