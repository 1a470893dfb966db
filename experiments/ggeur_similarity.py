"""GGEUR Fig. 6: class×class geometric similarity S (Eq. 3, top-5 eigenvectors) between a reference domain and each
other domain, from the embeddings a config's clients hold.

    python experiments/ggeur_similarity.py --config configs/ggeur/effnet/digits_offline.yaml \
        --reference mnist --out docs/figures/ggeur_similarity_digits_offline.png

A domain's class geometry is the eigendecomposition of the pooled covariance (Eq. 4) of that class over the domain's
clients. A high diagonal means a class has a similar shape in both domains, which is what justifies one shared
covariance per class.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="an flsuite fit config whose data holds embeddings")
    ap.add_argument("--reference", required=True, help="the domain every other domain is compared with")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="PNG path (a .json with the matrices is written beside it)")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flsuite.cli_parsers import fit_parser
    from flsuite.methods.ggeur import class_statistics, geometry, pooled_covariance, similarity

    parser = fit_parser()
    cfg = parser.parse_args(["--config", str(args.config), "--seed", str(args.seed)])
    data = parser.instantiate(cfg).data.build(args.seed)
    if args.reference not in data.domains:
        raise SystemExit(f"--reference {args.reference!r} is not a domain of this config: {data.domains}")

    def shapes(domain: str) -> dict[int, object]:
        clients = [c.train for c in data.clients if c.domain == domain]
        out = {}
        for c in range(data.num_classes):
            stats = [class_statistics(s.x[s.y == c]) for s in clients if int((s.y == c).sum()) > 1]
            if stats:
                out[c] = geometry(pooled_covariance(stats).cov, top_k=args.top)
        return out

    reference = shapes(args.reference)
    others = [d for d in data.domains if d != args.reference]
    matrices = {}
    fig, axes = plt.subplots(1, len(others), figsize=(4.2 * len(others), 3.8), squeeze=False)
    for ax, domain in zip(axes[0], others):
        shape = shapes(domain)
        m = np.full((data.num_classes, data.num_classes), np.nan)
        for i, gi in reference.items():
            for j, gj in shape.items():
                m[i, j] = similarity(gi, gj, top=args.top)
        matrices[domain] = m.tolist()
        im = ax.imshow(m, vmin=0, vmax=args.top, cmap="viridis")
        ax.set_title(f"{args.reference} vs {domain}")
        ax.set_xlabel(f"{domain} class")
        ax.set_ylabel(f"{args.reference} class")
        ax.set_xticks(range(data.num_classes), data.classes, fontsize=7)
        ax.set_yticks(range(data.num_classes), data.classes, fontsize=7)
        diag, off = np.nanmean(np.diag(m)), np.nanmean(m[~np.eye(len(m), dtype=bool)])
        ax.text(0.02, -0.25, f"diag {diag:.2f} / off-diag {off:.2f}", transform=ax.transAxes, fontsize=8)
        print(f"{args.reference} vs {domain}: mean S on the diagonal {diag:.3f}, off the diagonal {off:.3f}")
    fig.colorbar(im, ax=axes.ravel().tolist(), label=f"S (top {args.top})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    args.out.with_suffix(".json").write_text(
        json.dumps({"reference": args.reference, "top": args.top, "matrices": matrices}, indent=1)
    )


if __name__ == "__main__":
    main()
