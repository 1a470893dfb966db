"""Pretrained weights that can be neither read from their cache nor downloaded (offline, no file): the error, and where
the loaders look for the files (so the error can say where a file must go)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class WeightsUnavailableError(RuntimeError):
    """Pretrained weights that cannot be loaded here; the message says where the file must go, or which key turns
    them off. `keys`: the dotted config keys involved (to name the config file that set them)."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


def openclip_cache(tag_cfg: dict[str, Any]) -> str:
    """Where `open_clip.download_pretrained` looks for a tag's weights: the Hugging Face hub cache, or ~/.cache/clip."""
    hub = tag_cfg.get("hf_hub", "")
    try:
        from huggingface_hub import constants
    except ImportError:  # open_clip then downloads from the URL
        hub = ""
    if hub:
        repo = os.path.split(hub)[0]
        return f"Hugging Face's {Path(constants.HF_HUB_CACHE) / ('models--' + repo.replace('/', '--'))}"
    return str(Path("~/.cache/clip").expanduser() / os.path.basename(tag_cfg.get("url", "")))
