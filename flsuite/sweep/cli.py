"""`flsuite sweep FILE [--out DIR] [--trials N] [--workers W] [--seed S] [-- FIT FLAGS]`: the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flsuite.sweep.spec import SweepError
from flsuite.sweep.study import Sweep


def parser() -> argparse.ArgumentParser:
    from flsuite import sweep as package  # its docstring is the help text

    ap = argparse.ArgumentParser(
        prog="flsuite sweep", description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("file", type=Path, help="a W&B sweep file (sweeps/*.yaml)")
    ap.add_argument("--out", type=Path, help="sweep folder (default runs/sweeps/<file name>)")
    ap.add_argument(
        "--trials", type=int, help="finished trials to reach (default: the file's run_cap, or the grid's size)"
    )
    ap.add_argument("--workers", type=int, default=1, help="trials run at once, each in its own process (1)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed (0)")
    ap.epilog = "Flags after `--` are added to every trial's command (e.g. -- --rounds=10 --wandb.enabled=false)."
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser().parse_args(argv[:split]), argv[split + 1 :]
    out = args.out or Path("runs") / "sweeps" / args.file.stem
    if args.workers < 1:
        raise SweepError("--workers must be >= 1")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise SweepError(
            'flsuite sweep needs optuna: python -m pip install -e ".[sweep]" in the clone (or pip install optuna)'
        ) from None
    sweep = Sweep(args.file, out, workers=args.workers, seed=args.seed, extra=extra)
    sweep.run(args.trials)
    print((out / "trials.md").read_text())
    return 0
