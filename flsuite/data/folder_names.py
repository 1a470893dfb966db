"""Canonical domain and class names of the ImageFolder datasets (Office-Caltech-10, PACS), with the folder-name
aliases other copies of them use (resolved by :func:`flsuite.data.image_folder.scan_image_folder`)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "OFFICE_CALTECH10_CLASSES",
    "OFFICE_CALTECH10_CLASS_ALIASES",
    "OFFICE_CALTECH10_DOMAINS",
    "OFFICE_CALTECH10_DOMAIN_ALIASES",
    "PACS_CLASSES",
    "PACS_CLASS_ALIASES",
    "PACS_DOMAINS",
    "PACS_DOMAIN_ALIASES",
]

# Office-Caltech-10 (Gong et al., CVPR 2012): Office-31's amazon/dslr/webcam + Caltech-256, 10 classes.
OFFICE_CALTECH10_DOMAINS: tuple[str, ...] = ("amazon", "caltech", "dslr", "webcam")
OFFICE_CALTECH10_CLASSES: tuple[str, ...] = (
    "backpack",
    "bike",
    "calculator",
    "headphones",
    "keyboard",
    "laptop",
    "monitor",
    "mouse",
    "mug",
    "projector",
)
OFFICE_CALTECH10_DOMAIN_ALIASES: Mapping[str, tuple[str, ...]] = {
    "caltech": ("caltech10", "caltech256"),
}
# Office-31 / FedBN-style names and the original Caltech-256 folder names.
OFFICE_CALTECH10_CLASS_ALIASES: Mapping[str, tuple[str, ...]] = {
    "backpack": ("back_pack", "003.backpack"),
    "bike": ("224.touring-bike",),
    "calculator": ("027.calculator",),
    "headphones": ("head_phones", "101.head-phones"),
    "keyboard": ("computer_keyboard", "045.computer-keyboard"),
    "laptop": ("laptop_computer", "127.laptop-101"),
    "monitor": ("computer_monitor", "046.computer-monitor"),
    "mouse": ("computer_mouse", "047.computer-mouse"),
    "mug": ("coffee_mug", "041.coffee-mug"),
    "projector": ("video_projector", "238.video-projector"),
}

# PACS (Li et al., ICCV 2017).
PACS_DOMAINS: tuple[str, ...] = ("photo", "art_painting", "cartoon", "sketch")
PACS_CLASSES: tuple[str, ...] = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
PACS_DOMAIN_ALIASES: Mapping[str, tuple[str, ...]] = {"art_painting": ("art",), "photo": ("photos",)}
PACS_CLASS_ALIASES: Mapping[str, tuple[str, ...]] = {}
