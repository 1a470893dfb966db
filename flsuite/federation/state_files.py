"""The files beside a checkpoint (client states: `flsuite.federation.client_states`; published outputs and once-only
answers: `flsuite.federation.written_once`): each written atomically under a new name, read on the CPU with
`weights_only`, and the ones the written checkpoint no longer names removed after it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def save(value: Any, root: Path, name: str) -> None:
    """`value` to `root / name` atomically (temp file + rename): a kill mid-write leaves no half-written file."""
    tmp = root / f"{name}.tmp"
    torch.save(value, tmp)
    os.replace(tmp, root / name)


def load(root: Path, name: str) -> Any:
    """What `save` wrote to `root / name`."""
    return torch.load(root / name, map_location="cpu", weights_only=True)


def keep_only(root: Path, names: Iterable[str]) -> None:
    """Remove every file of `root` but `names` (earlier versions, and files of a killed run that never reached its
    checkpoint)."""
    keep = set(names)
    for path in root.glob("*.pt*"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
