"""Compare the "+ GGEUR" change of every baseline in a Table-4 study with the GGEUR paper's Table 4 (CLIP+MLP rows).

    python experiments/ggeur_table4_compare.py [--runs runs/ggeur_table4_digits_offline] [--out FILE]

For each method: AVG and STD (last-k rounds with k read from each run's summary, STD = population std across domains of
the last-k per-domain means; mean over seeds) without and with GGEUR, their change, on how many seeds
the change has the same sign as the mean change, the AVG change as a paired difference over seeds (SE, 95 % t interval,
"not resolved" when the interval holds 0), and the paper's numbers and change. Methods whose runs are missing are left
out; the seeds column says how many seeds each mean holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from flsuite.compare import domain_std, paired_difference
from flsuite.provenance import runs_code_mix
from flsuite.records import summary_prefix
from flsuite.seeding import label_key

# GGEUR (CVPR 2025) Table 4, Digits, CLIP+MLP rows: (AVG, STD) without and with GGEUR (Steps 1 & 2).
PAPER = {
    "FedAvg": ((76.60, 16.25), (82.36, 13.84)),
    "SCAFFOLD": ((76.93, 16.31), (80.70, 13.69)),
    "MOON": ((60.07, 15.14), (78.13, 16.08)),
    "FedDyn": ((79.19, 15.19), (82.31, 13.88)),
    "FedOpt": ((77.12, 14.96), (80.75, 14.54)),
    "FedProto": ((76.83, 17.40), (82.21, 13.96)),
    "FedNTD": ((78.86, 15.41), (82.13, 14.06)),
    "FedProx": None,  # not in the paper's Table 4
}


def per_seed(run: Path, read: list[Path]) -> dict[tuple[int, str], tuple[float, float]]:
    """seed -> (AVG, STD) of each finished seed: the last-k mean accuracy (k from the run's own summary keys) and the
    population std across domains of the last-k per-domain means (recomputed, so older summaries agree). The run
    folders read are added to `read`."""
    out = {}
    for path in sorted(run.glob("seed*/summary.json")):
        read.append(path.parent)
        summary = json.loads(path.read_text())
        out[label_key(path.parent.name)] = (
            float(summary[summary_prefix(summary) + "acc_mean"]),
            domain_std(summary)[0],
        )
    return out


def fmt_change(before: float, after: float) -> str:
    return f"{before:.2f} → {after:.2f} ({after - before:+.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, default=Path("runs/ggeur_table4_digits_offline"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = [
        (
            "| method | AVG: without → with GGEUR | seeds up | Δ AVG: SE, 95 % interval | STD: without → with "
            "| seeds down | paper AVG | paper STD | seeds |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    read: list[Path] = []  # every run folder the table reads: they should come from one code version
    for method, paper in PAPER.items():
        slug = method.lower()
        without, with_ggeur = per_seed(args.runs / slug, read), per_seed(args.runs / f"{slug}-ggeur", read)
        avg0, avg1 = ({s: v[0] for s, v in d.items()} for d in (without, with_ggeur))
        std0, std1 = ({s: v[1] for s, v in d.items()} for d in (without, with_ggeur))
        seeds = sorted(set(avg0) & set(avg1))
        if not seeds:
            continue
        a0, a1 = np.mean([avg0[s] for s in seeds]), np.mean([avg1[s] for s in seeds])
        s0, s1 = np.mean([std0[s] for s in seeds]), np.mean([std1[s] for s in seeds])
        change = paired_difference({s: avg1[s] for s in seeds}, avg0)
        _, se, interval, verdict = change.cells()
        up = sum(d > 0 for d in change.diffs)
        down = sum(std1[s] < std0[s] for s in seeds)
        paper_avg = fmt_change(paper[0][0], paper[1][0]) if paper else "—"
        paper_std = fmt_change(paper[0][1], paper[1][1]) if paper else "—"
        lines.append(
            f"| {method} | {fmt_change(a0, a1)} | {up}/{len(seeds)} | {se}, {interval}: {verdict} "
            f"| {fmt_change(s0, s1)} | {down}/{len(seeds)} "
            f"| {paper_avg} | {paper_std} | {len(seeds)} |"
        )
    if warning := runs_code_mix(read):
        print(warning, file=sys.stderr)
        lines += ["", f"**{warning}**"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
