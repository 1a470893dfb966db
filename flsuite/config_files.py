"""The `--config` files of a command line: which they are, a clear error for one that is not a YAML mapping, and which
of them (or which command-line flag) set the key of a config error: an unknown key, or a value of the wrong type (so
the error can name the file). And the one other file a command line reads: the cached text of `flsuite fit --help`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from flsuite.paths import code_fingerprint, user_cache_dir
from flsuite.runfolder import flatten

#: The help requests whose text is cached: `flsuite fit --help` needs every flsuite module (and so torch and
#: Lightning, ~6 s) imported to list the subclasses; the cached text is printed in a fraction of a second.
HELP_COMMANDS, HELP_FLAGS = ("fit", "features"), ("-h", "--help")


def config_files(argv: list[str]) -> list[Path]:
    """The `--config` files named on the command line, in order."""
    files = []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            files.append(Path(argv[i + 1]))
        elif arg.startswith("--config="):
            files.append(Path(arg.split("=", 1)[1]))
    return files


def check_config_files(files: list[Path]) -> None:
    """Malformed or empty YAML stops with an error naming the file (and the line), before jsonargparse sees it."""
    for path in files:
        if not path.is_file():
            continue  # jsonargparse names a missing file
        text = path.read_text()
        try:
            content = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err)
            raise ValueError(f"config file {path} is not valid YAML{where}: {problem}") from None
        if content is None:
            raise ValueError(f"config file {path} is empty")
        if not isinstance(content, dict):
            raise ValueError(
                f"config file {path} must hold a mapping of keys (e.g. `rounds: 10`), not a {type(content).__name__}"
            )


def parser_key(message: str) -> str | None:
    """The dotted config key a jsonargparse error is about ('Parser key "data": ... Parser key "partition"' ->
    `data.init_args.partition`); None when the message names none."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    return ".init_args.".join(keys) if keys else None


def _sets(flat_keys: list[str], key: str) -> bool:
    return any(f == key or f.startswith(key + ".") for f in flat_keys)


def _flat_keys(path: Path) -> list[str]:
    try:
        return list(flatten(yaml.safe_load(path.read_text()) or {}))
    except (OSError, yaml.YAMLError):
        return []


def setter_of(key: str, argv: list[str]) -> str | None:
    """Where the value of dotted `key` that took effect was set, as "in FILE" or "on the command line": the last
    `--config` file or flag (in argv's order, as jsonargparse applies them) that sets it or a key under it; None when
    nothing sets it (a default)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv) or arg.startswith("--config="):
            path = Path(argv[i + 1] if arg == "--config" else arg.split("=", 1)[1])
            if _sets(_flat_keys(path), key):
                found = f"in {path}"
        elif arg.startswith("--") and (_sets([flag := arg[2:].split("=", 1)[0]], key) or key.startswith(flag + ".")):
            found = "on the command line"
    return found


def blame_config_file(message: str, files: list[Path], argv: list[str] | None = None) -> str:
    """Where the key of a config error was set, as " (in FILE)"; "" when none is found. An unknown key: every config
    file holding it. A wrong value (`Parser key "rounds": Expected a <class 'int'>`): the file, or the command-line
    flag, whose value took effect (`setter_of`; with `argv`, else the last of `files` that sets it)."""
    keys = set(re.findall(r"[Oo]ption '([^']+)'", message))
    if not keys:
        key = parser_key(message)
        if key is None:
            return ""
        where = setter_of(key, argv if argv is not None else [a for f in files for a in ("--config", str(f))])
        return f" ({where})" if where else ""
    holders = []
    for path in files:
        flat = _flat_keys(path)
        if any(f == k or f.endswith("." + k) or k.rsplit(".", 1)[-1] in f.split(".") for f in flat for k in keys):
            holders.append(str(path))
    return f" (in {', '.join(holders)})" if holders else ""


def is_help_request(argv: list[str]) -> bool:
    """`flsuite fit --help` (or `features`, or `-h`) and nothing else: the requests whose text is cached."""
    return len(argv) == 2 and argv[0] in HELP_COMMANDS and argv[1] in HELP_FLAGS


def help_file(argv: list[str]) -> Path:
    """Where the help text of `argv` is cached: keyed by the request, the running code (`code_fingerprint`: any edit of
    flsuite or any package installed invalidates it) and what argparse formats by (the terminal's width, colour)."""
    state = [
        argv,
        code_fingerprint(),
        shutil.get_terminal_size().columns,
        [os.environ.get(k) for k in ("NO_COLOR", "FORCE_COLOR")],
    ]
    return user_cache_dir() / "help" / f"{hashlib.blake2b(json.dumps(state).encode(), digest_size=16).hexdigest()}.txt"


def cached_help(argv: list[str]) -> str | None:
    """The cached help text of `argv`, or None (not cached yet, or the cache is unreadable)."""
    try:
        return help_file(argv).read_text()
    except (OSError, RuntimeError):  # RuntimeError: no home folder to find the cache in
        return None


@contextlib.contextmanager
def caching_help(argv: list[str]) -> Iterator[None]:
    """Print what the block prints to stdout (a parser's help) and keep it as `argv`'s cached help; a cache that cannot
    be written is skipped silently (the help was printed)."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        text = buffer.getvalue()
        sys.stdout.write(text)
        if text:
            with contextlib.suppress(OSError, RuntimeError):
                path = help_file(argv)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
