"""FKPL's Stage-II server head (`fit_head`) on a `partner: all`-sized set of virtual features: the seconds of its
200-epoch server fit, this tree's against another tree's (e.g. the commit before issue 35) and against this tree's
lean loop, each measurement in a fresh process, alternated.

    python benchmarks/server_head.py [--before TREE] [--rows 83000] [--dim 3840] [--classes 7] [--epochs 2] [--reps 2]

The features are random (the fit's cost does not depend on their values; the same seeded draw on every side): `rows`
× `dim` (83,000 virtual features of `partner: all` on PACS, three 1280-d experts concatenated), SGD(lr 0.01,
momentum 0.9) at batch 64, FKPL's defaults, one thread. Sides:
  before    TREE's `fit_head` (flsuite/methods/fkpl/head.py, or fkpl_calibrate.py before the FKPL package), run with
            TREE first on sys.path, for `--epochs` epochs; its 200-epoch time is extrapolated (seconds per epoch × 200),
  lean      this tree's `fit_head` on the lean loop (`local.loop: lean`: streamed batches, each gathered when read),
            `--epochs` epochs, extrapolated the same way,
  after     this tree's `fit_head` as FKPL runs it (`local.loop: auto`, which compiles a fit this long), all 200
            epochs, timed whole: its compilation included, with an empty inductor cache (a first run on a machine).
Prints seconds per epoch (median over reps), the 200-epoch time, each side's ratio to the first, and the largest
weight difference from the first side's head (0: the same head bit for bit; the `after` side runs 200 epochs, so its
head is compared with `--epochs 200` only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HEAD_EPOCHS = 200
HERE = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """One measurement, in this process: build the features, time the side's head fit, save the head."""
    sys.path.insert(0, str(Path(args.tree).resolve()))
    import torch

    torch.set_num_threads(1)
    from flsuite.data.base import Split

    try:
        from flsuite.federation.server import RoundServer as Server
    except ImportError:  # before the round server took the ServerContext's place
        from flsuite.federation.server import ServerContext as Server  # type: ignore[attr-defined,no-redef]
    try:
        from flsuite.methods.fkpl.head import fit_head
    except ImportError:  # before FKPL became a package
        from flsuite.methods.fkpl_calibrate import fit_head  # type: ignore[no-redef]
    g = torch.Generator().manual_seed(0)
    split = Split(
        torch.randn(args.rows, args.dim, generator=g), torch.randint(0, args.classes, (args.rows,), generator=g)
    )
    server = Server(round=1, seed=0, results=[], num_clients=1, build_model=lambda: None)
    settings = SimpleNamespace(head_epochs=args.epochs, head_batch_size=64, head_lr=0.01, head_momentum=0.9)
    if args.side == "lean":  # fit_head itself, its LocalTraining on the lean loop
        import flsuite.methods.fkpl.head as head_module
        from flsuite.federation.task import LocalTraining

        head_module.LocalTraining = lambda **k: LocalTraining(**k, loop="lean")  # type: ignore[assignment,misc]

    start = time.perf_counter()
    head, _ = fit_head(server, split, args.classes, settings, "fkpl/head")
    seconds = (time.perf_counter() - start) / args.epochs
    torch.save(head, args.out)
    Path(args.out + ".json").write_text(json.dumps({"seconds_per_epoch": seconds}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a tree (a worktree of an earlier commit) whose fit_head is the 'before' side")
    ap.add_argument("--rows", type=int, default=83_000)
    ap.add_argument("--dim", type=int, default=3840)
    ap.add_argument("--classes", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sides", nargs="+", default=["before", "lean", "after"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    sides = [s for s in args.sides if s != "before" or args.before]
    import torch

    seconds: dict[str, list[float]] = {s: [] for s in sides}
    heads: dict[str, dict] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                out = f"{tmp}/{side}.pt"
                tree = args.before if side == "before" else str(HERE)
                cmd = [sys.executable, __file__, "--child", "--side", side, "--tree", tree, "--out", out]
                cmd += ["--rows", str(args.rows), "--dim", str(args.dim), "--classes", str(args.classes)]
                cmd += ["--epochs", str(HEAD_EPOCHS if side == "after" else args.epochs)]
                cache = tempfile.mkdtemp(dir=tmp)  # an empty inductor cache: the compiled side pays its compilation
                side_env = {**env, "TORCHINDUCTOR_CACHE_DIR": cache}
                subprocess.run(cmd, env=side_env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                seconds[side].append(json.loads(Path(out + ".json").read_text())["seconds_per_epoch"])
                heads[side] = torch.load(out)
    first = sides[0]
    base = statistics.median(seconds[first])
    shape = f"{args.rows:,} x {args.dim} features, {args.classes} classes, batch 64"
    print(f"{shape}, {args.epochs} epochs ('after': {HEAD_EPOCHS}) x {args.reps} reps")
    print(f"{'side':<8} {'s/epoch (each)':<22} {'median':>7} {'200 epochs':>11} {'ratio':>6}  max |w - {first}|")
    for side in sides:
        s = statistics.median(seconds[side])
        comparable = args.epochs == HEAD_EPOCHS or "after" not in (side, first)  # heads of as many epochs
        diff = max((heads[side][k] - heads[first][k]).abs().max().item() for k in heads[side]) if comparable else None
        each = ", ".join(f"{x:.3f}" for x in seconds[side])
        shown = f"{diff:.2e}" if diff is not None else "- (other epochs)"
        print(f"{side:<8} {each:<22} {s:7.3f} {s * HEAD_EPOCHS:10.1f}s {s / base:6.2f}  {shown}")


if __name__ == "__main__":
    main()
