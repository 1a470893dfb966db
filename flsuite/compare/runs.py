"""Finished run folders found (folders, globs, study folders) and read once: summary, metrics, timings, config, setup,
environment."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flsuite.provenance import environment_code, recorded_cpu
from flsuite.records import ACC_PREFIX, summary_prefix


@dataclass
class Run:
    """One finished run folder, read once."""

    path: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    timings: list[dict[str, Any]]
    config: dict[str, Any]
    setup: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)  # environment.json: versions, code version (`code`), argv

    @property
    def code(self) -> dict[str, Any] | None:
        """The code version the run recorded (`flsuite.provenance.environment_code`: the code that began it, marked
        when a resume ran other code), None for a run made before."""
        return environment_code(self.environment)

    @property
    def cpu(self) -> str | None:
        """The kind of CPU the run was made on (`flsuite.provenance.recorded_cpu`), None for a run made before."""
        return recorded_cpu(self.environment)

    @property
    def prefix(self) -> str:
        return summary_prefix(self.summary)

    @property
    def domains(self) -> list[str]:
        start = self.prefix + ACC_PREFIX
        return [k.removeprefix(start) for k in self.summary if k.startswith(start)]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(path: Path) -> Run:
    """Read a run folder's summary, metrics, timings and config."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{summary_file} does not exist (not a finished flsuite run folder)")
    summary = json.loads(summary_file.read_text())
    try:
        summary_prefix(summary)
    except KeyError as err:
        raise ValueError(f"{summary_file}: {err.args[0]}") from None
    setup_file = path / "setup.json"
    setup = json.loads(setup_file.read_text()) if setup_file.is_file() else {}
    env_file = path / "environment.json"
    environment = json.loads(env_file.read_text()) if env_file.is_file() else {}
    return Run(
        path,
        summary,
        _jsonl(path / "metrics.jsonl"),
        _jsonl(path / "timings.jsonl"),
        read_config(path),
        setup,
        environment,
    )


def find_runs(patterns: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """Run folders from folders, globs or study folders: (finished runs, unfinished ones skipped), sorted."""
    found: set[Path] = set()
    skipped: set[Path] = set()
    for pattern in patterns:
        matches = [Path(m) for m in sorted(glob.glob(str(pattern)))] or [Path(pattern)]
        for match in matches:
            if not match.exists():
                raise FileNotFoundError(f"{pattern}: no such run folder, study folder or glob match")
            if (match / "summary.json").is_file():
                found.add(match)
            elif (match / "metrics.jsonl").is_file():
                skipped.add(match)
            elif match.is_dir():  # every run below it, but those under a hidden folder (a driver's `.replaced/`)
                below = [
                    p.parent
                    for name in ("summary.json", "metrics.jsonl")
                    for p in match.rglob(name)
                    if not _hidden(p.relative_to(match))
                ]
                found |= {p for p in below if (p / "summary.json").is_file()}
                skipped |= {p for p in below if not (p / "summary.json").is_file()}
    if not found:
        raise FileNotFoundError(f"no finished run folder (with summary.json) under {', '.join(map(str, patterns))}")
    return sorted(found), sorted(skipped)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts[:-1])


def read_config(run: Path) -> dict[str, Any]:
    config_file = Path(run) / "config.yaml"
    return (yaml.safe_load(config_file.read_text()) if config_file.is_file() else None) or {}
