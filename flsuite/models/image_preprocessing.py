"""Batch preprocessing shared by the frozen encoders: :func:`prepare_images` (uint8 ``[B, C, H, W]`` → resized,
normalised float ``[B, 3, h, w]``), the ImageNet mean/std and interpolation-name lookup."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torchvision.transforms import InterpolationMode

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "prepare_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _interpolation(name: str) -> InterpolationMode:
    """Map an interpolation name ('bilinear', 'bicubic', ...) to torchvision's enum."""
    try:
        return InterpolationMode(name.lower())
    except ValueError as err:
        raise ValueError(f"Unknown interpolation mode {name!r}") from err


def prepare_images(
    images: Tensor,
    *,
    size: int | tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: InterpolationMode = InterpolationMode.BILINEAR,
    resize_mode: str = "shortest",
    device: torch.device | str = "cpu",
) -> Tensor:
    """Convert a uint8 ``[B, C, H, W]`` batch into a normalised float ``[B, 3, h, w]`` batch.

    With ``resize_mode="shortest"`` the shorter side is resized to the target
    size and the result centre-cropped (a plain resize for square inputs);
    ``"squash"`` resizes to the target size directly.  Grey images are repeated
    to three channels.  ``mean``/``std`` are given on the 0..255 pixel scale.
    """
    if resize_mode not in ("shortest", "squash"):
        raise ValueError(f"unsupported resize_mode {resize_mode!r} (use 'shortest' or 'squash')")
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected images of shape [B, 1|3, H, W], got {tuple(images.shape)}")
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images, got {images.dtype}")
    out_h, out_w = (size, size) if isinstance(size, int) else size
    x = images.to(device, non_blocking=True).float()
    if tuple(x.shape[-2:]) != (out_h, out_w):
        scale = max(out_h / x.shape[-2], out_w / x.shape[-1])
        resized = (max(out_h, round(x.shape[-2] * scale)), max(out_w, round(x.shape[-1] * scale)))
        if resize_mode == "squash":
            resized = (out_h, out_w)
        x = TF.resize(x, list(resized), interpolation=interpolation, antialias=True)
        if resized != (out_h, out_w):
            x = TF.center_crop(x, [out_h, out_w])
        if interpolation == InterpolationMode.BICUBIC:
            x = x.clamp_(0.0, 255.0)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return TF.normalize(x, list(mean), list(std))
