"""The keys runs logged to W&B (`plan.RunKeys`): read from run folders (what the tracker sent, replayed) or asked of
the W&B API for a project's runs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from flsuite.dashboard.plan import RunFilter, RunKeys
from flsuite.tracking import wandb_history


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_folder_keys(run_dir: Path) -> RunKeys:
    """A run folder's W&B keys: its round records and timings as `Tracker.log_round` sends them (with the running
    byte totals), and its summary plus setup-stage metrics (the W&B summary)."""
    history = wandb_history(_jsonl(run_dir / "metrics.jsonl"), _jsonl(run_dir / "timings.jsonl"))
    summary = {**_json(run_dir / "summary.json"), **_json(run_dir / "setup.json")}
    return RunKeys(frozenset(k for record in history for k in record), frozenset(summary))


def folders_keys(paths: Iterable[Path]) -> RunKeys:
    """The keys of every run folder (a folder holding metrics.jsonl) at or below `paths`."""
    keys = RunKeys(frozenset(), frozenset())
    found = 0
    for path in map(Path, paths):
        for metrics in [path / "metrics.jsonl"] if (path / "metrics.jsonl").is_file() else sorted(path.rglob("metrics.jsonl")):
            keys, found = keys.merged(run_folder_keys(metrics.parent)), found + 1
    if not found:
        raise FileNotFoundError(f"no run folder (with metrics.jsonl) at or below {', '.join(map(str, paths))}")
    return keys


def wandb_keys(entity: str, project: str, runs: RunFilter, limit: int = 200) -> RunKeys:
    """The keys of a project's runs (at most `limit`, newest first) that pass the filter, from the W&B API."""
    import wandb

    filters: dict[str, object] = {}
    if runs.group is not None:
        filters["group"] = runs.group
    if runs.tag is not None:
        filters["tags"] = {"$in": [runs.tag]}
    if runs.sweep is not None:
        filters["sweep"] = runs.sweep
    history: set[str] = set()
    summary: set[str] = set()
    for i, run in enumerate(wandb.Api().runs(f"{entity}/{project}", filters=filters, order="-created_at")):
        if i >= limit:
            break
        history.update((run.history_keys or {}).get("keys", {}))
        summary.update(k for k in run.summary.keys() if not k.startswith("_"))
    if not history and not summary:
        raise FileNotFoundError(f"no W&B runs in {entity}/{project} match {runs}")
    return RunKeys(frozenset(history), frozenset(summary))
