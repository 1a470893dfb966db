"""Where data and caches are looked for: relative paths in configs resolve against a base, not the working directory
alone.

- Dataset roots (`data.init_args.root`, `usps_mat`) resolve against `$FLSUITE_DATA`.
- The feature cache (`data.init_args.cache_dir`) resolves against `$FLSUITE_CACHE`.

Both default to the current working directory, so the shipped configs (written for the checkout: `../shared/data/…`,
`data/…`, `.cache/features`) work unchanged when run from the checkout, and from anywhere else with
`FLSUITE_DATA=/path/to/checkout FLSUITE_CACHE=/path/to/checkout`. Absolute paths and `~` are used as given. The
variables are read when the data is built, so the resolved config (and resume's comparison of configs) keeps the
paths exactly as written.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "FLSUITE_DATA"
CACHE_ENV = "FLSUITE_CACHE"


def _resolve(path: str | Path, env: str) -> Path:
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    base = os.environ.get(env)
    return Path(base).expanduser() / path if base else path


def data_path(path: str | Path) -> Path:
    """A dataset path from a config: relative → under `$FLSUITE_DATA` (default: the working directory)."""
    return _resolve(path, DATA_ENV)


def cache_path(path: str | Path) -> Path:
    """A cache path from a config: relative → under `$FLSUITE_CACHE` (default: the working directory)."""
    return _resolve(path, CACHE_ENV)


#: Where flsuite keeps its per-user cache (help texts), if set; the tests point it at a folder of their own.
USER_CACHE_ENV = "FLSUITE_USER_CACHE"


def user_cache_dir() -> Path:
    """flsuite's per-user cache (help texts): `$FLSUITE_USER_CACHE`, else `$XDG_CACHE_HOME/flsuite`, default
    `~/.cache/flsuite`."""
    if folder := os.environ.get(USER_CACHE_ENV):
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flsuite"


def code_fingerprint() -> str:
    """A digest of the code that is running: Python's version, every flsuite source file's (path, size, mtime) and the
    mtime of every folder on `sys.path` but the first (the script's folder or the working directory); installing,
    upgrading or removing a package changes its folder's mtime. What is cached from the code's output (help texts, the
    feature cache's index) holds only under the same digest. A few hundred `stat` calls, ~5 ms."""
    import hashlib
    import sys

    package = Path(__file__).resolve().parent
    state: list[object] = [sys.version, str(package)]
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        state.append((str(path.relative_to(package)), st.st_size, st.st_mtime_ns))
    for entry in sys.path[1:]:
        if os.path.isdir(entry):
            state.append((entry, os.stat(entry).st_mtime_ns))
    return hashlib.blake2b(repr(state).encode(), digest_size=16).hexdigest()
