"""`Augment` (the `local.augment` config): per-sample random crop with zero padding and horizontal flip of image
batches, drawn from a `torch.Generator`. Written on batched tensors with plain indexing (torchvision.transforms.v2
draws one set of parameters per call, i.e. per batch, not per sample). The batches that apply it are built by
`flsuite.federation.local.batches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Augment:
    """Per-sample training augmentation of image batches [N, C, H, W] (test data is never augmented).

    Args:
        crop_padding: Random crop of the original size from the image zero-padded by this many pixels on each side
            (the CIFAR recipe: 4); 0: off.
        hflip: Flip each image horizontally with probability 1/2.
    """

    crop_padding: int = 0
    hflip: bool = False

    def __post_init__(self) -> None:
        if self.crop_padding < 0:
            raise ValueError(f"local.augment.crop_padding must be >= 0, got {self.crop_padding}")

    @property
    def enabled(self) -> bool:
        return self.crop_padding > 0 or self.hflip

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The augmented batch (on `x`'s device); the random draws come from the CPU `generator`: first the flips
        [N], then the crop offsets [N, 2]."""
        if not self.enabled:
            return x
        if x.ndim != 4:
            raise ValueError(f"local.augment needs image batches [N, C, H, W], got shape {list(x.shape)}")
        n, _, h, w = x.shape
        if self.hflip:
            flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        if self.crop_padding:
            p = self.crop_padding
            offsets = torch.randint(0, 2 * p + 1, (n, 2), generator=generator).to(x.device)
            padded = F.pad(x, (p, p, p, p))
            rows = offsets[:, 0, None] + torch.arange(h, device=x.device)  # [N, H]
            cols = offsets[:, 1, None] + torch.arange(w, device=x.device)  # [N, W]
            batch = torch.arange(n, device=x.device)[:, None, None]
            x = padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()  # [N,H,W,C]→
        return x
