"""FKPL Stage 0 study: threshold → number of clusters V → purity against the true domains, from the
`fkpl_clusters.json` of FKPL runs (Stage 0 scans the thresholds itself, so no extra run is needed).

    python experiments/fkpl_clustering.py runs/fkpl_methods_*/fkpl/seed* --out docs/results/fkpl_clustering.md
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="FKPL run folders")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    lines = ["# FKPL Stage 0: threshold → V → purity", "", "Regenerate: `bash experiments/fkpl_studies.sh` (last step).", ""]
    lines += ["| run | clients | configured threshold (°) | V | purity | max angle (°) |", "|---|---|---|---|---|---|"]
    scans: dict[str, dict[float, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in args.runs:
        path = run / "fkpl_clusters.json"
        if not path.is_file():
            continue
        c = json.loads(path.read_text())
        first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
        top = max(max(row) for row in c["angles"])
        lines.append(f"| {run} | {len(c['labels'])} | {first['cluster/threshold']} | {len(c['clusters'])} | {c['purity']:.3f} | {top:.2f} |")
        study = str(run.parent.parent.name)
        for row in c["scan"]:
            scans[study][row["threshold"]].append((row["num_clusters"], row["purity"]))
    for study, rows in scans.items():
        lines += ["", f"## {study}: the scan (mean over seeds)", "", "| threshold (°) | V | purity |", "|---|---|---|"]
        for t in sorted(rows):
            vs, ps = zip(*rows[t])
            lines.append(f"| {t:g} | {sum(vs) / len(vs):.2f} | {sum(ps) / len(ps):.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
