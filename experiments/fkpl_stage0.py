"""FKPL Stage 0 of configs, without training: the clients' subspace bases on the data as `flsuite fit` builds it
(the run's derived seeds), the angle matrix under both angle definitions, the same-domain and cross-domain angle
ranges, V and purity at the configured threshold and at the paper's (Office 5.3°, PACS 4.2°, DomainNet 11.5°), and the
thresholds at which the configured linkage recovers the true domains exactly (V = number of domains, purity 1).

    python experiments/fkpl_stage0.py configs/fkpl/*.yaml [--out docs/results/fkpl_stage0.md] [--step 0.1] [--ablate]
        [--fit-args '--seed 1']
    (an entry "base.yaml+overlay.yaml" composes configs, as repeated --config does: e.g.
    +configs/fkpl/stage0_official.yaml)

Seconds per config (an SVD per client); a config whose data is not on this machine is reported as such.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from flsuite.cli import federation_from_configs
from flsuite.methods.fkpl import FKPL
from flsuite.methods.fkpl.cluster import angle_matrix, cluster, purity
from flsuite.methods.fkpl.settings import Angle, Linkage
from flsuite.methods.fkpl.subspace import SubspaceBasis, client_bases
from flsuite.runtime import keep_freed_memory

#: The paper's Stage-0 thresholds (degrees) by suite.
PAPER_THRESHOLD = {"office_caltech10": 5.3, "pacs": 4.2, "domainnet": 11.5}


def recovering(angles: np.ndarray, domains: list[str], step: float, linkage: Linkage) -> str:
    """The threshold intervals (degrees, on a `step` grid) at which the clustering is exactly the domains."""
    want = len(set(domains))
    grid = np.arange(step, float(angles.max()) + 2 * step, step)
    hits = [
        t
        for t in grid
        if (labels := cluster(angles, float(t), linkage)) and max(labels) + 1 == want and purity(labels, domains) == 1.0
    ]
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


def stage0_kind(query: SubspaceBasis, linkage: str) -> str:
    """The Stage 0 a row runs, in short: inputs, basis, linkage."""
    inputs = [f"{query.size}px"] if query.size else []
    inputs += ["aug"] * query.augment + ["norm"] * query.normalize
    basis = f"per-class {query.budget} p={query.p}" if query.per_class else f"whole p={query.p}"
    return f"{'+'.join(inputs) or 'raw'}; {basis}; {linkage}"


def span(values: np.ndarray) -> str:
    return f"{values.min():.2f}–{values.max():.2f}" if values.size else "—"


def stage0_rows(config: str, step: float, ablate: bool, fit_args: list[str]) -> list[str]:
    """Both angles on the configured Stage 0; with `ablate`, the configured angle with Stage 0's augmentation and
    normalisation each switched off (the inputs' share in the angles)."""
    federation = federation_from_configs(*config.split("+"), args=fit_args)
    method = federation.method
    if not isinstance(method, FKPL):
        return []
    fed, _ = federation.build_data()
    domains = [c.domain for c in fed.clients]
    same = np.array([[a == b for b in domains] for a in domains]) & ~np.eye(len(domains), dtype=bool)
    cross = ~np.array([[a == b for b in domains] for a in domains])
    paper = PAPER_THRESHOLD.get(getattr(federation.data, "suite", ""))
    configured = method.subspace_query()
    queries: list[tuple[SubspaceBasis, tuple[Angle, ...]]] = [(configured, ("exact", "pacfl"))]
    if ablate and (configured.augment or configured.normalize):
        for aug, norm in ((False, False), (False, True), (True, False)):
            if (aug, norm) != (configured.augment, configured.normalize):
                queries.append((replace(configured, augment=aug, normalize=norm), (method.stage0.angle,)))
    rows = []
    for query, angle_names in queries:
        bases = client_bases(fed, query, federation.seed)
        for angle in angle_names:
            angles = angle_matrix(bases, angle)
            at = []
            for t in (method.stage0.threshold, paper):
                labels = cluster(angles, t, method.stage0.linkage) if t is not None else None
                at.append(f"{t} | {max(labels) + 1} | {purity(labels, domains):.2f}" if labels else "— | — | —")
            mark = " (configured)" if angle == method.stage0.angle else ""
            rows.append(
                f"| {config} | {stage0_kind(query, method.stage0.linkage)} | {'×'.join(map(str, fed.input_shape))} "
                f"| {len(fed.clients)} / {len(set(domains))} "
                f"| {angle}{mark} | {at[0]} | {at[1]} | {span(angles[same])} | {span(angles[cross])} "
                f"| {recovering(angles, domains, step, method.stage0.linkage)} |"
            )
    return rows


def main() -> None:
    keep_freed_memory()  # as `flsuite fit` does: image decoding and SVDs otherwise fault in fresh pages all the time
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--step", type=float, default=0.1)
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="also Stage 0 without its augmentation / normalisation (configs that set them)",
    )
    ap.add_argument("--fit-args", default="", help="flsuite fit options for every config, e.g. '--seed 1'")
    args = ap.parse_args()
    lines = [
        "# FKPL Stage 0 of the shipped configs",
        "",
        f"Regenerate: `python experiments/fkpl_stage0.py {shlex.join(sys.argv[1:])}`.",
        "",
        (
            "Stage 0: Stage 0's inputs (`stage0_size` px, `aug`: the official augmentation, "
            "`norm`: ImageNet mean/std; `raw`: as the"
        ),
        (
            "data holds them); the basis (whole client, "
            "or per class with the `floor` or official `counts` budget); the linkage"
        ),
        (
            "(`average`: scikit-learn UPGMA, `weighted`: the official code's). "
            "Both angle definitions are shown on the same bases;"
        ),
        (
            "V and purity at the configured threshold and at the paper's; "
            "angle ranges over client pairs of the same and of"
        ),
        "different domains; the thresholds recovering the domains on a 0.1° grid with the configured linkage.",
        "",
        (
            "| config | Stage 0 | input | clients / domains | angle | threshold (°) | V | purity "
            "| paper threshold (°) | V | purity "
            "| same-domain angles (°) | cross-domain angles (°) | thresholds recovering the domains (°) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for config in args.configs:
        try:
            rows = stage0_rows(config, args.step, args.ablate, shlex.split(args.fit_args))
        except Exception as e:  # noqa: BLE001 - report and go on (e.g. a dataset not on this machine)
            rows = [
                f"| {config} | not built here: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]} |"
                + " |" * 12
            ]
        print("\n".join(rows), flush=True)
        lines += rows
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
