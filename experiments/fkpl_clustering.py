"""FKPL Stage 0 study: threshold → number of clusters V → purity against the true domains, from the
`fkpl_clusters.json` of FKPL runs (Stage 0 scans the thresholds itself, so no extra run is needed).

    python experiments/fkpl_clustering.py runs/fkpl_methods_*/fkpl/seed* --out docs/results/fkpl_clustering.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from flsuite.methods.fkpl.cluster import threshold_scan
from flsuite.provenance import runs_code_mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FKPL run folders")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--step", type=float, default=1.0, help="threshold grid step (degrees) of the common scan")
    ap.add_argument("--command", default="bash experiments/fkpl_studies.sh", help="the regenerating command")
    args = ap.parse_args()
    lines = ["# FKPL Stage 0: threshold → V → purity", "", f"Regenerate: `{args.command}`.", ""]
    lines += ["| run | clients | configured threshold (°) | V | purity | max angle (°) |", "|---|---|---|---|---|---|"]
    found: dict[str, list[tuple[np.ndarray, list[str], float]]] = defaultdict(list)
    read: list[Path] = []  # every run folder the tables read: they should come from one code version
    for run in args.runs:
        path = run / "fkpl_clusters.json"
        if not path.is_file() or "angles" not in json.loads(path.read_text()):
            continue
        c = json.loads(path.read_text())
        angles = np.array(c["angles"])
        threshold = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["cluster/threshold"]
        lines.append(
            f"| {run} | {len(c['labels'])} | {threshold} | {len(c['clusters'])} | {c['purity']:.3f} | "
            f"{angles.max():.2f} |"
        )
        found[run.parent.parent.name].append((angles, c["domains"], threshold))
        read.append(run)
    for study, runs in found.items():
        top = max(a.max() for a, _, _ in runs)
        grid = sorted(
            {*np.arange(0.0, np.ceil(top) + args.step, args.step).round(4).tolist(), *(t for _, _, t in runs)}
        )
        lines += [
            "",
            f"## {study}: the scan on a common grid ({len(runs)} runs; V and purity: mean, min–max over runs)",
            "",
        ]
        lines += ["| threshold (°) | V | V min–max | purity | purity min–max |", "|---|---|---|---|---|"]
        for t in grid:
            rows = [threshold_scan(a, d, [t])[0] for a, d, _ in runs]
            vs, ps = [r["num_clusters"] for r in rows], [r["purity"] for r in rows]
            lines.append(
                f"| {t:g} | {np.mean(vs):.2f} | {min(vs)}–{max(vs)} | {np.mean(ps):.3f} | {min(ps):.3f}–{max(ps):.3f} |"
            )
    if warning := runs_code_mix(read):
        print(warning, file=sys.stderr)
        lines += ["", f"**{warning}**"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
