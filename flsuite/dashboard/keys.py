"""The keys runs logged to W&B (`plan.RunKeys`): read from run folders (what the tracker sent, replayed) or asked of
the W&B API for a project's runs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from flsuite.compare.runs import find_runs, load_run
from flsuite.dashboard.plan import RunFilter, RunKeys
from flsuite.tracking import wandb_history


def run_folder_keys(run_dir: Path) -> RunKeys:
    """A finished run folder's W&B keys: its round records and timings as `Tracker.log_round` sends them (with the
    running byte totals), and its summary plus setup-stage metrics (the W&B summary); read as `flsuite compare` reads
    it (`flsuite.compare.runs.load_run`)."""
    run = load_run(run_dir)
    history = wandb_history(run.history, run.timings)
    return RunKeys(frozenset(k for record in history for k in record), frozenset({**run.summary, **run.setup}))


def folders_keys(paths: Iterable[Path]) -> RunKeys:
    """The keys of every finished run folder that `flsuite compare` finds at `paths` (folders, globs, study folders)."""
    keys = RunKeys(frozenset(), frozenset())
    for run_dir in find_runs(list(paths))[0]:
        keys = keys.merged(run_folder_keys(run_dir))
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
