"""The feature cache's index: whether a build of the data is already embedded, decided from file stats alone.

After a build that embedded (or found cached) every image it needs, `flsuite features` writes one entry in
`<cache_dir>/index/<key>.json`, under two keys:

- the *request*: the resolved config's `data`, data seed (`data_seed`, else `seed`) and `validation`, the working
  directory, `$FLSUITE_DATA` and `$FLSUITE_CACHE` (what decides which files are read and which rows embedded), and the
  stats of any file the config names (e.g. a local encoder checkpoint);
- the *command line*: its arguments and those same places, the bytes of its `--config` files and the stats of any file
  they or the arguments name, so that `flsuite features` can look it up before any parser (torch, Lightning) is built.

An entry holds what the build's result depends on beyond its config: the running code (`code_fingerprint`: flsuite's
sources, the installed packages), every file's (path, size, mtime) under the source's input folders
(`DataSource.source_folders`), and every cache file the build read (size, mtime). A lookup is a hit when all are
unchanged: no image is read, no encoder built. Anything changed (an image touched or added, flsuite edited, a package
installed, a cache file rewritten by another seed's run) is a miss: the build runs as before, re-embedding what the
cache's own key (image bytes, encoder weights) says changed, and records a new entry. Sources that cannot name their
input folders (downloads, data shipped in packages) are never indexed. The index trusts mtimes, as make does: a file
rewritten with the same size and mtime is not noticed.

An entry also holds, for a `Benchmark` that embedded, each image pool it read (`pools`: the pool's cache file, size,
labels and class names), so that `flsuite fit` on a hit builds its data from the cache files alone
(`Benchmark.use_index`): no image decoded, no encoder built; the partition, the splits and the features are the
build's own, bit for bit (the index does not store rows: they are recomputed from the labels and the seed as before).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flsuite.paths import CACHE_ENV, DATA_ENV, cache_path, code_fingerprint

__all__ = [
    "DEFAULT_CACHE_DIR",
    "IndexEntry",
    "Recording",
    "command_line_cache_dir",
    "command_line_key",
    "lookup",
    "lookup_command_line",
    "note_pool",
    "record",
    "recording",
    "request_key",
    "resolved_cache_dir",
]

INDEX_FORMAT = "1"
#: `Benchmark`'s default `cache_dir` (what a command line that sets none uses; a test checks they agree).
DEFAULT_CACHE_DIR = ".cache/features"


@dataclass
class Recording:
    """What a build served from the feature cache (`recording`): (cache file, rows served) per cached
    `extract_features` call, and each `Benchmark` pool by name (`note_pool`)."""

    caches: list[tuple[Path, int]] = field(default_factory=list)
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)


_USED: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("feature_cache_used", default=None)


@dataclass(frozen=True)
class IndexEntry:
    """One indexed build: how many images it embeds, where, its `flsuite features` report, and the state it was
    recorded in (`code`, `folders`: path/files/digest, `caches`: path/size/mtime_ns)."""

    images: int
    cache_dir: str
    report: dict[str, Any]
    code: str
    folders: list[dict[str, Any]]
    caches: list[dict[str, Any]]
    format: str = INDEX_FORMAT
    #: name -> {"cache", "size", "labels", "classes"} of each Benchmark pool the build read (`note_pool`); empty for
    #: entries written before pools were recorded (they answer `flsuite features`, not `flsuite fit`).
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)

    def answer(self, start: float) -> dict[str, Any]:
        """`flsuite features`' answer from the index: "already embedded: N images, <cache>" on stderr, the recorded
        report on stdout (its `seconds`: this answer's, since `start`, a `time.perf_counter()`)."""
        print(f"already embedded: {self.images:,} images, {self.cache_dir}", file=sys.stderr)
        report = {k: v for k, v in self.report.items() if k != "samples_per_s"}
        report |= {"seconds": round(time.perf_counter() - start, 2), "already_embedded": True}
        print(json.dumps(report, indent=2))
        return report


def _digest(value: object) -> str:
    return hashlib.blake2b(json.dumps(value, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def _file_state(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def folder_state(folder: Path) -> dict[str, Any]:
    """Every file under `folder` as (relative path, size, mtime), digested: one `stat` per file, no file opened."""
    files: list[tuple[str, int, int]] = []
    stack = [str(folder)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for e in entries:
                if e.is_dir():
                    stack.append(e.path)
                else:
                    st = e.stat()
                    files.append((os.path.relpath(e.path, folder), st.st_size, st.st_mtime_ns))
    return {"path": str(Path(folder).resolve()), "files": len(files), "digest": _digest(sorted(files))}


def _places() -> dict[str, str | None]:
    return {"cwd": os.getcwd(), DATA_ENV: os.environ.get(DATA_ENV), CACHE_ENV: os.environ.get(CACHE_ENV)}


def _named_files(value: object, bases: Sequence[Path]) -> list[dict[str, Any]]:
    """The stats of every file a config value names (a string that is a file's path from one of `bases`)."""
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _named_files(v, bases)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _named_files(v, bases)]
    if isinstance(value, str) and value and len(value) < 1024:
        for base in bases:
            with contextlib.suppress(OSError, ValueError):
                if (path := base / value).is_file():
                    return [_file_state(path.resolve())]
    return []


def request_key(resolved: Mapping[str, Any]) -> str:
    """The index key of a resolved config (a dict of `flsuite fit --print_config`): its data, data seed (under `seed`:
    the key of a config without `data_seed` is as before it existed) and validation."""
    request = {k: resolved.get(k) for k in ("data", "seed", "validation")}
    if resolved.get("data_seed") is not None:  # `flsuite.seeding.Seeds`: the data seed decides the build, not `seed`
        request["seed"] = resolved["data_seed"]
    return _digest({"request": request, "places": _places(), "files": _named_files(request, [Path.cwd()])})


def command_line_key(argv: Sequence[str], config_files: Sequence[Path]) -> str:
    """The index key of `flsuite features ARGV`, computed without parsing it (no parser, no import of torch)."""
    contents: list[object] = []
    for path in config_files:
        text = path.read_bytes()
        contents.append({"path": str(path.resolve()), "blake2b": hashlib.blake2b(text).hexdigest()})
        contents.append(_named_files(yaml.safe_load(text), [Path.cwd(), path.resolve().parent]))
    return _digest(
        {"argv": list(argv), "places": _places(), "configs": contents, "files": _named_files(list(argv), [Path.cwd()])}
    )


def resolved_cache_dir(resolved: Mapping[str, Any]) -> Path | None:
    """The feature cache folder of a resolved config (`data.init_args.cache_dir`), None when it has none."""
    value = (resolved.get("data") or {}).get("init_args", {}).get("cache_dir")
    return cache_path(str(value)) if value is not None else None


def command_line_cache_dir(argv: Sequence[str], config_files: Sequence[Path]) -> Path | None:
    """Where the cache of `flsuite features ARGV` is, read from the YAML files and flags without a parser: the last
    `data.init_args.cache_dir` set (default `DEFAULT_CACHE_DIR`), None when it is null. A guess that differs from the
    resolved config only costs a miss: entries are written under the resolved folder."""
    value: object = DEFAULT_CACHE_DIR
    for path in config_files:
        data = (yaml.safe_load(path.read_text()) or {}).get("data")
        init = data.get("init_args") if isinstance(data, dict) else None
        if isinstance(init, dict) and "cache_dir" in init:
            value = init["cache_dir"]
    flag = "--data.init_args.cache_dir"
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return None if value in (None, "null", "None") else cache_path(str(value))


def lookup_command_line(argv: Sequence[str], config_files: Sequence[Path]) -> IndexEntry | None:
    """The entry of `flsuite features ARGV` by its command line alone (no parser), or None."""
    try:
        cache_dir = command_line_cache_dir(argv, config_files)
        return lookup(cache_dir, command_line_key(argv, config_files)) if cache_dir is not None else None
    except (
        OSError,
        ValueError,
        AttributeError,
        yaml.YAMLError,
    ):  # a missing or malformed file: the full command names it
        return None


def lookup(cache_dir: Path, key: str) -> IndexEntry | None:
    """The entry under `key` if everything it recorded is unchanged (stats only), else None."""
    try:
        entry = IndexEntry(**json.loads((cache_dir / "index" / f"{key}.json").read_text()))
        if entry.format != INDEX_FORMAT or entry.code != code_fingerprint():
            return None
        if any(folder_state(Path(f["path"])) != f for f in entry.folders) or any(
            _file_state(Path(c["path"])) != c for c in entry.caches
        ):
            return None
    except (OSError, ValueError, TypeError, KeyError):  # absent, unreadable or of another format: a miss
        return None
    return entry


def record(
    cache_dir: Path,
    keys: Sequence[str],
    images: int,
    report: Mapping[str, Any],
    folders: Sequence[Path],
    caches: Sequence[Path],
    pools: Mapping[str, Mapping[str, Any]] | None = None,
) -> IndexEntry | None:
    """Write the entry of a finished build under every key (atomically); a file that cannot be read (a dangling link)
    or a folder that cannot be written leaves the build unindexed (None). `pools`: the build's `Recording.pools`."""
    try:
        entry = IndexEntry(
            images=images,
            cache_dir=str(cache_dir),
            report=dict(report),
            code=code_fingerprint(),
            folders=[folder_state(f) for f in folders],
            caches=[_file_state(Path(c).resolve()) for c in dict.fromkeys(caches)],
            pools={name: dict(pool) for name, pool in (pools or {}).items()},
        )
    except OSError:
        return None
    return rewrite(cache_dir, keys, entry)


def rewrite(cache_dir: Path, keys: Sequence[str], entry: IndexEntry) -> IndexEntry:
    """Write `entry` under `keys` (e.g. a hit found by its request, under the command line's key too)."""
    text = json.dumps(asdict(entry), indent=1)
    with contextlib.suppress(OSError):
        (cache_dir / "index").mkdir(parents=True, exist_ok=True)
        for key in keys:
            fd, tmp = tempfile.mkstemp(dir=cache_dir / "index", prefix=f".{key}.", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, cache_dir / "index" / f"{key}.json")
    return entry


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Collect what every cached `extract_features` call (`note_used`) and every `Benchmark` pool (`note_pool`) in the
    block served."""
    used = Recording()
    token = _USED.set(used)
    try:
        yield used
    finally:
        _USED.reset(token)


def note_used(path: Path, rows: int) -> None:
    """Called by `extract_features` after it served `rows` rows from (or into) the cache file `path`."""
    used = _USED.get()
    if used is not None:
        used.caches.append((path, rows))


def recording_active() -> bool:
    """Whether a `recording` block is open (a caller can skip gathering what `note_pool` would only drop)."""
    return _USED.get() is not None


def note_pool(name: str, labels: Sequence[int], classes: Sequence[str]) -> None:
    """Called by `Benchmark` right after `extract_features` served rows of the pool `name` (whole-pool `labels` and
    `classes`): the pool is the cache file that call noted last."""
    used = _USED.get()
    if used is not None and used.caches:
        path = Path(used.caches[-1][0]).resolve()
        used.pools[name] = {
            "cache": str(path),
            "size": len(labels),
            "labels": [int(v) for v in labels],
            "classes": list(classes),
        }
