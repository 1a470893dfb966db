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
