"""Wall time of a study of N short runs: warm worker processes (`flsuite.pool.WarmPool`, study.py's default) against a
fresh `flsuite fit` process per run (`--fresh_processes`, as before the pool), alternated.

    python benchmarks/study_pool.py [--runs 8] [--rounds 2] [--workers 2] [--reps 2] [--config configs/quickstart.yaml]

Each study is `experiments/study.py` with N variants of the same config (labels r1..rN, seed 0: one `flsuite
features` call, N runs), into a fresh folder under a temporary directory; the two sides alternate within each
repetition (pool first in odd repetitions, fresh first in even ones). Prints every study's wall time, the median per
side, the seconds saved per run ((fresh - pool) / N), and the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def study(out: Path, config: Path, runs: int, rounds: int, workers: int, fresh: bool) -> float:
    """Seconds one study takes, start to exit; a failing study stops the benchmark."""
    variants = [a for i in range(1, runs + 1) for a in ("--variant", f"r{i}=")]
    cmd = [sys.executable, str(ROOT / "experiments" / "study.py"), "--name", "bench", "--base", str(config), *variants]
    cmd += [
        "--seeds",
        "0",
        "--workers",
        str(workers),
        "--runs",
        str(out),
        *(["--fresh_processes"] if fresh else []),
        "--",
        "--rounds",
        str(rounds),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"study failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart.yaml")
    args = ap.parse_args()
    load = os.getloadavg()
    times: dict[str, list[float]] = {"pool": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="study-pool-") as tmp:
        for rep in range(args.reps):
            for side in ("pool", "fresh") if rep % 2 == 0 else ("fresh", "pool"):
                out = Path(tmp) / f"{side}{rep}"
                times[side].append(
                    study(out, args.config.resolve(), args.runs, args.rounds, args.workers, side == "fresh")
                )
                print(f"rep {rep} {side}: {times[side][-1]:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    after = os.getloadavg()
    print(
        f"\nload average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load)}; "
        f"after: {' '.join(f'{x:.2f}' for x in after)}"
    )
    print(f"{args.runs} runs of {args.config.name} ({args.rounds} rounds), {args.workers} workers\n")
    print("| side | study wall s (each, in order) | median s | per run s |")
    print("|---|---|---|---|")
    for side, values in times.items():
        print(
            f"| {side} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} | "
            f"{statistics.median(values) / args.runs:.2f} |"
        )
    saved = (statistics.median(times["fresh"]) - statistics.median(times["pool"])) / args.runs
    print(
        f"\nsaved per run (medians): {saved:.2f} s; "
        f"ratio pool/fresh: {statistics.median(times['pool']) / statistics.median(times['fresh']):.2f}"
    )


if __name__ == "__main__":
    main()
