"""Run a study (config variants × seeds) with `flsuite fit` and write its results table.

    python experiments/study.py --name ggeur_digits_offline \
        --base configs/ggeur/effnet/digits_offline.yaml \
        --variant "FedAvg=" \
        --variant "+ GGEUR (Step 1)=configs/ggeur/with_ggeur_step1.yaml" \
        --variant "+ GGEUR (Step 1 & 2)=configs/ggeur/with_ggeur.yaml" \
        --seeds 0 1 2 --workers 2 --out docs/results/ggeur_digits_offline.md

A variant may stack overlays, e.g. "SCAFFOLD + GGEUR=configs/baselines/scaffold.yaml,configs/ggeur/with_ggeur.yaml".
Each run goes to `runs/<name>/<variant>/seed<k>` and is skipped when its `summary.json` exists, so a killed study
continues where it stopped. Features are extracted first, one seed at a time (`flsuite features`), so parallel
workers only read the cache. Workers run with one torch thread each. The table reports, per variant, each domain's
last-5-round accuracy and the AVG and STD (population, across domains) as mean ± standard deviation over seeds.
Extra `flsuite fit` flags for every run can follow `--`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "base"


def fit_command(base: Path, overlay: str, seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "flsuite.cli", "fit", "--config", str(base)]
    for path in filter(None, overlay.split(",")):
        cmd += ["--config", path]
    return cmd + ["--seed", str(seed), "--run_dir", str(run_dir), "--progress", "false", "--wandb.enabled", "false", *extra]


def run(cmd: list[str], log: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode


def table(name: str, variants: list[tuple[str, str]], seeds: list[int], runs: Path, command: str) -> str:
    rows, domains = [], None
    for label, _ in variants:
        summaries = [json.loads(p.read_text()) for s in seeds if (p := runs / slug(label) / f"seed{s}" / "summary.json").is_file()]
        if not summaries:
            continue
        if domains is None:
            domains = [k.removeprefix("last5/acc/") for k in summaries[0] if k.startswith("last5/acc/")]

        def cell(key: str) -> str:
            values = np.array([s[key] for s in summaries])
            return f"{values.mean():.2f} ± {values.std(ddof=0):.2f}" if len(values) > 1 else f"{values.mean():.2f}"

        cells = [cell(f"last5/acc/{d}") for d in domains] + [cell("last5/acc_mean"), cell("last5/acc_std")]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {len(summaries)} |")
    header = "| method | " + " | ".join(domains or []) + " | AVG | STD | seeds |"
    rule = "|---" * (len(domains or []) + 4) + "|"
    return "\n".join([f"## {name}", "", "Last-5-round top-1 accuracy (%), mean ± std over seeds; STD = population std across domains.", "",
                      header, rule, *rows, "", "Regenerate with:", "", "```bash", command, "```", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True, help='"Label=overlay.yaml[,more.yaml]" (empty = the base alone)')
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=Path, default=Path("runs"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--command", help="the regenerating command printed under the table (default: this invocation)")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="flags passed to every flsuite fit after --")
    args = ap.parse_args()
    extra = [a for a in args.extra if a != "--"]
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    runs = args.runs / args.name

    for seed in args.seeds:  # fill the feature cache once per seed before parallel runs
        cmd = [sys.executable, "-m", "flsuite.cli", "features", "--config", str(args.base), "--seed", str(seed), *extra]
        if run(cmd, runs / f"features-seed{seed}.log") != 0:
            sys.exit(f"feature extraction failed: see {runs / f'features-seed{seed}.log'}")

    jobs = [(label, overlay, seed) for seed in args.seeds for label, overlay in variants
            if not (runs / slug(label) / f"seed{seed}" / "summary.json").is_file()]

    def job(item: tuple[str, str, int]) -> tuple[str, int, int]:
        label, overlay, seed = item
        run_dir = runs / slug(label) / f"seed{seed}"
        if (run_dir / "summary.json").is_file():  # finished meanwhile (e.g. by another study of the same name)
            return label, seed, 0
        code = run(fit_command(args.base, overlay, seed, run_dir, extra), runs / slug(label) / f"seed{seed}.log")
        print(f"{label} seed {seed}: exit {code}", flush=True)
        return label, seed, code

    with ThreadPoolExecutor(args.workers) as pool:
        failed = [r for r in pool.map(job, jobs) if r[2] != 0]
    command = args.command or "python experiments/study.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = table(args.name, variants, args.seeds, runs, command)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if failed:
        sys.exit(f"failed runs: {failed}")


if __name__ == "__main__":
    main()
