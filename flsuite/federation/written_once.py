"""Checkpointed values that never change once the run has them: what a phase published (`RunContext.publish`: a value
is replaced by publishing again, never changed in place) and a once-only query's answer (`RunContext.query_once`).

A checkpoint writes each such value to a file of its own the first time it holds it (`parts/<key>-<generation>.pt`,
written atomically) and names the files; later checkpoints name the same file instead of writing the value again. A
value is "the same" when it is the same object as the one written. The files a checkpoint no longer names are removed
once it is written, so a kill at any point leaves the previous checkpoint and its files intact (as client states:
`flsuite.federation.client_states`). Why: FKPL's 159 checkpoints of a reduced PACS run each rewrote every finished
expert's weights and, from its calibration on, 38 MB of query answers (docs/performance.md, "Checkpoints").
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flsuite.federation import state_files


def file_stem(key: str) -> str:
    """A file name for `key` (`outputs/experts/expert0`): its readable characters and a short hash of the whole key,
    so two keys never share a file."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")[:60]
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


class WrittenOnce:
    """The values written by earlier checkpoints of this run: key → (the value, its file in `root`)."""

    def __init__(self) -> None:
        self._written: dict[str, tuple[object, str]] = {}
        self.root: Path | None = None

    def write(
        self, root: Path, generation: int, values: Mapping[str, object], payload: Callable[[object], Any]
    ) -> dict[str, str]:
        """Write every value of `values` not written before (`payload(value)` is what is saved) to its own file in
        `root`, atomically, under a name of this `generation`; returns key → the file the checkpoint must name."""
        if values:  # no folder for a run that publishes nothing
            root.mkdir(parents=True, exist_ok=True)
        moved = self.root is not None and self.root.resolve() != root.resolve()  # a checkpoint written somewhere new
        files: dict[str, str] = {}
        for key, value in values.items():
            kept = self._written.get(key)
            if kept is not None and kept[0] is value:
                if moved:
                    assert self.root is not None
                    shutil.copyfile(self.root / kept[1], root / kept[1])
                files[key] = kept[1]
                continue
            name = f"{file_stem(key)}-{generation}.pt"
            state_files.save(payload(value), root, name)
            files[key] = name
        return files

    def committed(self, root: Path, values: Mapping[str, object], files: Mapping[str, str]) -> None:
        """The checkpoint naming `files` is written: remember what each holds, and remove every file in `root` it does
        not name (values since replaced, and files of a killed run that never reached its checkpoint)."""
        self._written, self.root = {key: (values[key], files[key]) for key in files}, root
        state_files.keep_only(root, files.values())

    def loaded(self, root: Path, key: str, name: str, value: object) -> None:
        """`value` was read from `root / name` (a resumed run): a later checkpoint names that file again."""
        self._written[key], self.root = (value, name), root
