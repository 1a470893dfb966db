"""FKPL Stage 0 of configs, without training: the clients' subspace bases on the data as `flsuite fit` builds it,
the angle matrix under both angle definitions, V and purity at the configured threshold, and the thresholds at which
average linkage recovers the true domains exactly (V = number of domains, purity 1).

    python experiments/fkpl_stage0.py configs/fkpl/*.yaml [--out docs/results/fkpl_stage0.md] [--step 0.1]
    (an entry "base.yaml+overlay.yaml" composes configs, as repeated --config does)

Seconds per config (an SVD per client); a config whose data is not on this machine is reported as such.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from flsuite.cli import federation_from_configs
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl_cluster import SubspaceBasis, angle_matrix, cluster, purity
from flsuite.runtime import keep_freed_memory


def recovering(angles: np.ndarray, domains: list[str], step: float) -> str:
    """The threshold intervals (degrees, on a `step` grid) at which the clustering is exactly the domains."""
    want = len(set(domains))
    grid = np.arange(step, float(angles.max()) + 2 * step, step)
    hits = [t for t in grid if (labels := cluster(angles, float(t))) and max(labels) + 1 == want and purity(labels, domains) == 1.0]
    if not hits:
        return "none"
    spans, start, prev = [], hits[0], hits[0]
    for t in hits[1:]:
        if t - prev > step * 1.5:
            spans.append((start, prev))
            start = t
        prev = t
    spans.append((start, prev))
    return ", ".join(f"{a:.1f}–{b:.1f}" for a, b in spans)


def stage0_rows(config: str, step: float) -> list[str]:
    federation = federation_from_configs(*config.split("+"))
    method = federation.method
    if not isinstance(method, FKPL):
        return []
    fed, _ = federation.build_data()
    query = SubspaceBasis(method.basis, method.per_class)
    bases = [query.compute(client, None, None)["basis"] for client in fed.clients]
    domains = [c.domain for c in fed.clients]
    rows = []
    for angle in ("exact", "pacfl"):
        angles = angle_matrix(bases, angle)
        labels = cluster(angles, method.threshold)
        configured = " (configured)" if angle == method.angle else ""
        off = angles[~np.eye(len(angles), dtype=bool)]
        rows.append(
            f"| {config} | {'×'.join(map(str, fed.input_shape))} | {len(fed.clients)} / {len(set(domains))} | {angle}{configured} | {method.threshold} "
            f"| {max(labels) + 1} | {purity(labels, domains):.2f} | {off.min():.2f}–{off.max():.2f} | {recovering(angles, domains, step)} |"
        )
    return rows


def main() -> None:
    keep_freed_memory()  # as `flsuite fit` does: image decoding and SVDs otherwise fault in fresh pages all the time
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--step", type=float, default=0.1)
    args = ap.parse_args()
    lines = [
        "# FKPL Stage 0 of the shipped configs",
        "",
        f"Regenerate: `python experiments/fkpl_stage0.py {' '.join(args.configs)}`. Per-class bases: the config's `per_class`.",
        "",
        "| config | input | clients / domains | angle | threshold (°) | V | purity | off-diagonal angles (°) | thresholds recovering the domains (°) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for config in args.configs:
        try:
            rows = stage0_rows(config, args.step)
        except Exception as e:  # noqa: BLE001 - report and go on (e.g. a dataset not on this machine)
            rows = [f"| {config} | not built here: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]} | | | | | | | |"]
        print("\n".join(rows), flush=True)
        lines += rows
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
