"""Wall time of `flsuite` commands that do not train, before and after a change, alternated.

    python benchmarks/startup.py [--before DIR] [--reps 5] [--features CONFIG] [--print_config CONFIG]

Every command runs in a fresh process through the console script beside this Python (`<venv>/bin/flsuite`), as a
user types it. "after" is the installed flsuite; "before" is, with `PYTHONPATH=DIR`, a source tree of an earlier
version (`git archive <rev> | tar -x -C DIR`, or a worktree), which Python then imports instead, through what that
version's console script ran (its pyproject.toml's `flsuite = "module:function"`, called as the script calls it: the
entry point moved from `flsuite.cli:main` to `flsuite.cli:command`). One untimed run of
each command and side comes first: it fills `fit --help`'s cached text and the feature cache's index, as any earlier
use would, and warms the page cache. Then `--reps` rounds, each running every command on both sides in turn. Prints
a Markdown table of every time and the median, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "flsuite"


def console_script(tree: Path) -> list[str]:
    """What the `flsuite` console script of the version in `tree` runs: its entry point, called as the script does."""
    entry = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["scripts"]["flsuite"]
    module, function = entry.split(":")
    call = f"import sys; from {module} import {function}; sys.argv[0] = 'flsuite'; sys.exit({function}())"
    return [sys.executable, "-P", "-c", call]  # -P: not the working directory first (PYTHONPATH's tree is)


def timed(argv: list[str], pythonpath: Path | None) -> float:
    """Seconds one `flsuite ARGV` takes, start to exit (output discarded); a failing command stops the benchmark."""
    env = dict(os.environ)
    script = [str(SCRIPT)]
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
        script = console_script(pythonpath)
    start = time.perf_counter()
    subprocess.run([*script, *argv], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--before", type=Path, help="a source tree of the earlier flsuite (omit: time the installed one only)"
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--features", type=Path, help="also time `flsuite features --config CONFIG` (its cache filled)")
    ap.add_argument(
        "--print_config",
        type=Path,
        help="also time `flsuite fit --config CONFIG --print_config`: a run's start (every module its parser imports, "
        "the config parsed) without its training",
    )
    args = ap.parse_args()
    commands = [["--version"], ["fit", "--help"]]
    if args.features is not None:
        commands.append(["features", "--config", str(args.features), "--progress", "false"])
    if args.print_config is not None:
        commands.append(["fit", "--config", str(args.print_config), "--print_config"])
    sides: dict[str, Path | None] = (
        {"after": None} if args.before is None else {"before": args.before.resolve(), "after": None}
    )
    load = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.reps + 1):
        for argv in commands:
            for side, path in sides.items():
                seconds = timed(argv, path)
                if rep:  # the first round is the untimed warm-up
                    times.setdefault((" ".join(argv), side), []).append(seconds)
    print(
        f"load average (1, 5, 15 min) before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print("| command | side | wall s (each run, in order) | median s |")
    print("|---|---|---|---|")
    for (command, side), values in times.items():
        print(
            f"| `flsuite {command}` | {side} | {', '.join(f'{v:.2f}' for v in values)} | "
            f"{statistics.median(values):.2f} |"
        )


if __name__ == "__main__":
    main()
