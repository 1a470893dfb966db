"""GGEUR generation throughput (embeddings/s) against the bare cost of the same matrix products.

For 10 classes × 2,000 samples at p = 512 and 1280:
  bare      torch.randn(M, p) then (ε · s(λ)) @ Ξᵀ plus the repeated bases, in float64: the lower bound on the work;
  generate  flsuite.methods.ggeur.generate (what GGEUR.run calls per class and client);
  stage     the whole GGEUR.run on a one-client federation holding 20 originals per class (client statistics,
            Eq. 4, float64 eigendecomposition, Step 1 generation to 2,000 per class, trimming, concatenation).
Alternated in one process; medians of --reps. Ratios are what matters on a shared machine.

    python benchmarks/ggeur_generation.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flsuite.data.base import ClientData, FederatedData, Split
from flsuite.methods.ggeur import GGEUR, generate, geometry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per_class", type=int, default=2000)
    args = ap.parse_args()
    print(
        f"threads={torch.get_num_threads()}  {args.classes} classes × {args.per_class} samples, median of {args.reps}"
    )
    print(f"{'p':>6}{'bare (emb/s)':>16}{'generate (emb/s)':>19}{'ratio':>8}{'whole stage (emb/s)':>22}")
    for p in (512, 1280):
        g = torch.Generator().manual_seed(0)
        originals = 20
        n = args.classes * args.per_class
        a = torch.randn(p, p, generator=g, dtype=torch.float64) / p**0.5
        shape = geometry(a @ a.T)
        bases = torch.randn(originals, p, generator=g)
        per_base = -(-args.per_class // originals)
        scale = shape.eigenvalues.sqrt()

        def bare() -> None:
            for _ in range(args.classes):
                eps = torch.randn(originals * per_base, p, generator=g, dtype=torch.float64)
                bases.to(torch.float64).repeat_interleave(per_base, 0) + (eps * scale) @ shape.eigenvectors.T

        def gen() -> None:
            for _ in range(args.classes):
                generate(bases, shape, per_base, g)

        y = torch.arange(args.classes).repeat_interleave(originals)
        x = torch.randn(len(y), p, generator=g)
        data = FederatedData([ClientData(0, "d", Split(x, y))], {"d": Split(x[:10], y[:10])}, num_classes=args.classes)
        stage = GGEUR(mode="single", target_per_class=args.per_class)

        def whole() -> None:
            stage.run(data, seed=0)

        times: dict[str, list[float]] = {"bare": [], "gen": [], "whole": []}
        for fn in (bare, gen, whole):
            fn()  # warm-up
        for _ in range(args.reps):
            for key, fn in (("bare", bare), ("gen", gen), ("whole", whole)):
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        b, gt, w = (statistics.median(times[k]) for k in ("bare", "gen", "whole"))
        print(f"{p:>6}{n / b:>16.0f}{n / gt:>19.0f}{b / gt:>8.2f}{(n - len(y)) / w:>22.0f}")


if __name__ == "__main__":
    main()
