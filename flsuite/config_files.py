"""The `--config` files of a command line: which they are, a clear error for one that is not a YAML mapping, and which
of them holds a key jsonargparse did not know (so its error can name the file)."""

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


def blame_config_file(message: str, files: list[Path]) -> str:
    """For an unknown-key error, the config file(s) that hold that key, as " (in FILE)"; "" when none is found."""
    keys = set(re.findall(r"[Oo]ption '([^']+)'", message))
    if not keys:
        return ""
    holders = []
    for path in files:
        try:
            flat = flatten(yaml.safe_load(path.read_text()) or {})
        except (OSError, yaml.YAMLError):
            continue
        if any(f == k or f.endswith("." + k) or k.rsplit(".", 1)[-1] in f.split(".") for f in flat for k in keys):
            holders.append(str(path))
    return f" (in {', '.join(holders)})" if holders else ""
