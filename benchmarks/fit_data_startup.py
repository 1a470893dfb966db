"""A feature config's `flsuite fit` start-up to its data, with and without the feature cache's index, alternated.

    python benchmarks/fit_data_startup.py [--config configs/fkpl/pacs_effnet.yaml] [--reps 3]

Each side is a fresh process that parses the config as `flsuite fit` does and builds the run's federation and its data:
"build" as before the index was consulted (`flsuite.fit_data.build_federation`: the encoder built, every image decoded
and hashed to find its cache entries), "index" as `flsuite fit` does now (`flsuite.fit_data.fit_federation`: on a hit no
image decoded, no encoder built). An untimed `flsuite features --config CONFIG` comes first (it fills the cache and
records the index); an "index" process that misses says so (a flsuite edit meanwhile changes the fingerprint). Prints,
per process, the seconds from the parsed config to the built data (imports and parser excluded, they are the same on
both sides) and the whole process's wall time, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, logging, sys, time
from flsuite.cli import build_federation, fit_federation, resolved_config_yaml
from flsuite.cli_parsers import fit_parser
logging.basicConfig(level=logging.INFO)
parser = fit_parser()
cfg = parser.parse_args(["--config", sys.argv[2], "--progress", "false", "--wandb.enabled", "false"])
start = time.perf_counter()
if sys.argv[1] == "index":
    federation = fit_federation(parser, cfg, resolved_config_yaml(parser, cfg))
else:
    federation = build_federation(parser, cfg)
data = federation.data.build(cfg.seed)
print(json.dumps({
    "seconds": time.perf_counter() - start,
    "encoder_built": getattr(federation.data, "encoder", None) is not None,
}))
"""


def one(side: str, config: Path) -> tuple[float, float, bool]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, side, str(config)], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{side} failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if side == "index" and "already embedded (feature cache index)" not in done.stderr:
        print("index side missed (run flsuite features --config CONFIG first)", file=sys.stderr)
    return report["seconds"], wall, report["encoder_built"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "fkpl" / "pacs_effnet.yaml")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    # untimed: fill the cache and record the index as the running code does (any flsuite edit since is a miss)
    subprocess.run(
        [sys.executable, "-m", "flsuite.cli", "features", "--config", str(args.config), "--progress", "false"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    load = os.getloadavg()
    times: dict[str, list[tuple[float, float, bool]]] = {"build": [], "index": []}
    for rep in range(args.reps):
        for side in ("build", "index") if rep % 2 == 0 else ("index", "build"):
            times[side].append(one(side, args.config.resolve()))
            print(
                f"rep {rep} {side}: {times[side][-1][0]:.2f} s to data, {times[side][-1][1]:.1f} s wall "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    print(
        f"\nload average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load)}; "
        f"after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print("| side | config to data, s (each) | median | process wall, s (each) | median | encoder built |")
    print("|---|---|---|---|---|---|")
    for side, values in times.items():
        data, wall = [v[0] for v in values], [v[1] for v in values]
        print(
            f"| {side} | {', '.join(f'{v:.2f}' for v in data)} | {statistics.median(data):.2f} | "
            f"{', '.join(f'{v:.1f}' for v in wall)} | "
            f"{statistics.median(wall):.1f} | {values[0][2]} |"
        )


if __name__ == "__main__":
    main()
