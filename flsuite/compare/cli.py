"""`flsuite compare RUNS... [--out DIR] [--target ACC] [--title T] [--by folder|KEY...] [--reference LABEL]
[--wandb-report]`: the command line."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from flsuite.compare.groups import group_by_config, group_by_experiment, group_by_parent
from flsuite.compare.report import compare, write_report
from flsuite.compare.runs import find_runs


def parser() -> argparse.ArgumentParser:
    from flsuite import compare as package  # its docstring is the help text

    ap = argparse.ArgumentParser(
        prog="flsuite compare", description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", help="run folders, globs (quote them) or study folders")
    ap.add_argument("--out", type=Path, help="write compare.md, compare.html and convergence.png into this folder")
    ap.add_argument("--target", type=float, help="report the first round whose acc_mean reaches this accuracy (%%)")
    ap.add_argument("--title", default="Method comparison")
    ap.add_argument(
        "--by",
        nargs="+",
        metavar="KEY",
        help="group by parent folder ('folder') or by these config keys (e.g. a sweep's swept option) instead of "
        "by experiment (equal configs but for the seed and where/how a run executed)",
    )
    ap.add_argument(
        "--reference",
        metavar="LABEL",
        help="the group every paired difference is taken against (default: the first row)",
    )
    ap.add_argument(
        "--wandb-report",
        action="store_true",
        help=(
            "publish the comparison as a W&B report over the same runs (online), "
            "or write its spec wandb_report.json into --out (offline); "
            'needs pip install "flsuite[dashboard]"'
        ),
    )
    ap.add_argument("--project", help="with --wandb-report: the W&B project (default: the runs' wandb.project)")
    ap.add_argument(
        "--entity", help="with --wandb-report: the W&B entity (default: the runs' wandb.entity, else yours)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.wandb_report:
        from flsuite.dashboard.spec import require_library

        require_library()  # before any work
    runs, skipped = find_runs(args.runs)
    if args.by == ["folder"]:
        groups, across_configs = group_by_parent(runs), False
    elif args.by:
        groups, across_configs = group_by_config(runs, args.by), True
    else:
        groups, across_configs = group_by_experiment(runs), False
    comparison = compare(groups, args.target, skipped, across_configs, args.reference)
    if args.out:
        files = write_report(comparison, args.out, args.title)
        print(files["markdown"].read_text())
        print(f"wrote {', '.join(str(p) for p in files.values())}")
    else:
        print(comparison.markdown(args.title))
    if args.wandb_report:
        from flsuite.dashboard.publish import REPORT_FILE, publish

        command = "flsuite compare " + shlex.join(sys.argv[2:] if argv is None else list(argv))
        spec_file = args.out and args.out / REPORT_FILE
        print(f"W&B report: {publish(comparison, args.title, command, spec_file, args.project, args.entity)}")
    return 0
