"""`flsuite dashboard`: the command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flsuite.dashboard import spec
from flsuite.dashboard.keys import folders_keys, wandb_keys
from flsuite.dashboard.plan import RunFilter, SweepFile, View, project_view, sweep_view


def parser() -> argparse.ArgumentParser:
    from flsuite import dashboard as package  # its docstring is the help text

    ap = argparse.ArgumentParser(
        prog="flsuite dashboard", description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--project", help="W&B project (default: the sweep file's, with --sweep)")
    ap.add_argument("--entity", help="W&B entity (default: your default entity; none in a dry run)")
    runs = ap.add_mutually_exclusive_group()
    runs.add_argument("--group", help="only the runs of this W&B group (flsuite's `name`: one experiment or study)")
    runs.add_argument("--tag", help="only the runs with this tag (e.g. a method or a dataset)")
    runs.add_argument("--sweep-id", help="only the runs of this W&B sweep")
    ap.add_argument("--sweep", type=Path, help="build the view of this sweep file (sweeps/*.yaml) instead")
    ap.add_argument(
        "--runs",
        nargs="+",
        type=Path,
        help="read the logged keys from these run folders (or folders of runs) instead of W&B",
    )
    ap.add_argument("--last-k", type=int, default=5, help="the last-k prefix when no run says it (5)")
    ap.add_argument("--name", help="the view's name")
    ap.add_argument(
        "--dry-run", type=Path, metavar="OUT.json", help="write the view's spec here (no network) instead of saving it"
    )
    return ap


def build(args: argparse.Namespace) -> tuple[View, str]:
    """The view the arguments ask for, and its project."""
    runs = RunFilter(group=args.group, tag=args.tag, sweep=args.sweep_id)
    if args.sweep is not None:
        sweep = SweepFile.read(args.sweep)
        view = sweep_view(sweep, runs if runs != RunFilter() else None)
        project = args.project or sweep.project
    else:
        project = args.project
    if not project:
        raise ValueError("flsuite dashboard needs --project (or a --sweep file naming one)")
    if args.sweep is None:
        if args.runs:
            keys = folders_keys(args.runs)
        elif args.dry_run is None:
            keys = wandb_keys(args.entity or default_entity(), project, runs)
        else:
            keys = None  # no network: every declared panel
        view = project_view(keys, runs, last_k=args.last_k)
    if args.name:
        view = View(args.name, view.runs, view.sections, view.by_method)
    return view, project


def default_entity() -> str:
    import wandb

    return str(wandb.Api().default_entity)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        spec.require_library()
    except spec.MissingExtraError as err:
        print(f"flsuite dashboard: error: {err}", file=sys.stderr)
        return 2
    view, project = build(args)
    if args.dry_run is not None:
        path = spec.write_spec(spec.workspace(view, args.entity or "", project), args.dry_run)
        print(f"wrote the workspace spec of {project!r} ({sum(len(s.panels) for s in view.sections)} panels) to {path}")
        return 0
    print(spec.save(spec.workspace(view, args.entity or default_entity(), project)))
    return 0
