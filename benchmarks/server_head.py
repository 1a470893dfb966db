"""FKPL's Stage-II server head (`flsuite.methods.fkpl.head.fit_head`) on a `partner: all`-sized set of virtual
features: seconds per epoch of the server fit, its loops and batch gathers side by side, alternated in one process.

    python benchmarks/server_head.py [--rows 83000] [--dim 3840] [--classes 7] [--epochs 3] [--reps 2]

The features are random (the fit's cost does not depend on their values): `rows` × `dim` (83,000 virtual features
of `partner: all` on PACS, three 1280-d experts concatenated), SGD(lr 0.01, momentum 0.9) at batch 64, FKPL's
defaults. Variants:
  fresh     the lean loop, each epoch gathered into a new tensor (the server fit before issue 35's item 4),
  reused    the lean loop, each epoch gathered into the same buffer (`EpochBatches(reuse=True)`, what fit_head does),
  compiled  the compiled loop (`local.loop: compiled`) over the reused gathers.
Prints seconds per epoch (median over reps), the 200-epoch extrapolation (FKPL's head_epochs), each variant's ratio
to `fresh`, and the largest weight difference from `fresh`'s head (0 where only the gather changed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flsuite.data.base import EpochBatches, Split
from flsuite.federation.local.trainer import _quiet_lightning
from flsuite.federation.server import RoundServer
from flsuite.federation.task import LocalTraining
from flsuite.models.heads import Linear

HEAD_EPOCHS = 200


def fit(server: RoundServer, split: Split, classes: int, epochs: int, variant: str) -> tuple[float, dict]:
    local = LocalTraining(
        epochs=epochs,
        batch_size=64,
        lr=0.01,
        momentum=0.9,
        weight_decay=0.0,
        loop="compiled" if variant == "compiled" else "lean",
    )
    torch.manual_seed(server.seed_for("head/init"))
    model = Linear().build(tuple(split.x.shape[1:]), classes)
    batches = EpochBatches(
        split, local.batch_size, server.generator("head/batches"), epochs=epochs, reuse=variant != "fresh"
    )
    start = time.perf_counter()
    server.train(model, batches, local, "head")
    return (time.perf_counter() - start) / epochs, {k: v.clone() for k, v in model.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=83_000)
    ap.add_argument("--dim", type=int, default=3840)
    ap.add_argument("--classes", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["fresh", "reused", "compiled"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    _quiet_lightning()
    g = torch.Generator().manual_seed(0)
    split = Split(
        torch.randn(args.rows, args.dim, generator=g), torch.randint(0, args.classes, (args.rows,), generator=g)
    )
    server = RoundServer(round=1, seed=0, results=[], num_clients=1, build_model=lambda: None)
    if "compiled" in args.variants:  # compile once outside the timings (once per process in a run)
        fit(server, Split(split.x[:640], split.y[:640]), args.classes, 1, "compiled")
    seconds: dict[str, list[float]] = {v: [] for v in args.variants}
    heads: dict[str, dict] = {}
    for _ in range(args.reps):
        for variant in args.variants:
            s, heads[variant] = fit(server, split, args.classes, args.epochs, variant)
            seconds[variant].append(s)
    base = statistics.median(seconds[args.variants[0]])
    print(
        f"{args.rows:,} x {args.dim} features, {args.classes} classes, batch 64,"
        f" {args.epochs} epochs x {args.reps} reps"
    )
    print(f"{'variant':<10} {'s/epoch':>8} {'200 epochs':>11} {'ratio':>6}  max |w - {args.variants[0]}|")
    for variant in args.variants:
        s = statistics.median(seconds[variant])
        diff = max((heads[variant][k] - heads[args.variants[0]][k]).abs().max().item() for k in heads[variant])
        print(f"{variant:<10} {s:8.3f} {s * HEAD_EPOCHS:10.1f}s {s / base:6.2f}  {diff:.2e}")


if __name__ == "__main__":
    main()
