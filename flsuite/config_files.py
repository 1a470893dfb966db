"""The `--config` files of a command line: which they are, a clear error for one that is not a YAML mapping, and which
of them (or which command-line flag) set the key of a config error: an unknown key, or a value of the wrong type (so
the error can name the file)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from flsuite.runfolder import flatten


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
            raise ValueError(f"config file {path} must hold a mapping of keys (e.g. `rounds: 10`), not a {type(content).__name__}")


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
