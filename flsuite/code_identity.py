"""The code a process runs: the package version and the git state of the checkout it is imported from (what a run
records under `code` in environment.json, and what `flsuite.provenance.same_experiment` compares).

Decisions:
- The code version (`code_version`, recorded in every run's environment.json under `code`): the package version, the
  git commit of the checkout the package is imported from and whether that tree has uncommitted changes, plus, when
  it has, a fingerprint of those changes (`uncommitted`: sha256 over the path and content of every changed, deleted
  or untracked, not ignored, file). Changes under `docs/` (`NOT_CODE`) are not code: a study writes its table
  there, and before this one study's table made the next study in the same checkout rerun every run it shared. A
  virtual environment inside the checkout (a folder holding `pyvenv.cfg`, such as the README's `.venv`, where it is
  not ignored) is not code either: the run records its packages' versions itself, and fingerprinting one read every
  installed file (6.4 GB, ~9 s per process, and every run "dirty"). One `git status` call, once per process (the code
  a process runs is the code it imported at start). The commit is
  null (and no error) when the package is not imported from a git checkout (an installed wheel), when git is
  missing, or when git fails.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Folders whose uncommitted changes are not code (no run reads them): the study drivers write their tables into
#: docs/results/, and a table written by one study must not make the next study in the same checkout "other code".
NOT_CODE = ("docs/",)


def package_root() -> Path:
    """The folder holding the `flsuite` package (a checkout's root when imported from one)."""
    return Path(__file__).resolve().parent.parent


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("flsuite")
    except Exception:  # noqa: BLE001 - a source tree that is not installed
        from flsuite import __version__

        return __version__


def git_state(root: Path) -> tuple[str | None, str | None]:
    """(commit, fingerprint of the uncommitted changes or None for a clean tree) of the checkout at `root`; (None,
    None) when `root` is not a checkout's top folder, git is missing or fails."""
    if not (root / ".git").exists():  # a folder inside some other checkout (a venv's site-packages) is not one
        return None, None
    try:
        done = subprocess.run(
            [
                "git",
                "--no-optional-locks",
                "-C",
                str(root),
                "status",
                "--porcelain=v2",
                "-z",
                "--branch",
                "--untracked-files=all",
            ],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    if done.returncode != 0:
        return None, None
    fields = done.stdout.decode("utf-8", "surrogateescape").split("\0")
    commit, changed, i = None, [], 0
    while i < len(fields):
        entry = fields[i]
        if entry.startswith("# branch.oid "):
            oid = entry.removeprefix("# branch.oid ")
            commit = oid if oid != "(initial)" else None
        elif entry[:2] in ("1 ", "u ", "? "):
            changed.append(entry.split(" ", {"1 ": 8, "u ": 10, "? ": 1}[entry[:2]])[-1])
        elif entry.startswith("2 "):  # a rename: its new path, then the old one in the next field
            changed += [entry.split(" ", 9)[-1], fields[i + 1]]
            i += 1
        i += 1
    if commit is None:
        return None, None
    venvs = tuple(path.removesuffix("pyvenv.cfg") for path in changed if path.endswith("/pyvenv.cfg"))
    changed = [path for path in changed if not path.startswith(NOT_CODE) and not path.startswith(venvs)]
    return commit, (_fingerprint(root, changed) if changed else None)


def _fingerprint(root: Path, paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(set(paths)):
        path = root / rel
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        try:
            digest.update(
                str(path.readlink()).encode()
                if path.is_symlink()
                else path.read_bytes()
                if path.is_file()
                else b"<not a file>"
            )
        except OSError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def code_version() -> dict[str, Any]:
    """This process's code: {version, commit, dirty, uncommitted} (see the module's decisions); computed once."""
    commit, uncommitted = git_state(package_root())
    return {
        "version": _version(),
        "commit": commit,
        "dirty": None if commit is None else uncommitted is not None,
        "uncommitted": uncommitted,
    }
