"""Cost against the number of clients N, 10 sampled per round: s/round, start-up s, peak RSS, bytes written per round.

    python benchmarks/scale.py --clients 10 100 1000 10000 --methods fedavg scaffold --rounds 3 --out runs/bench_scale

Each point runs in its own process (peak RSS is the process's): `GaussianFeatures` (256-d, 10 classes, 16 samples per
client), MLP 256 → 1024 → 1024 → 10 (1.3 M parameters), 1 local epoch of batch 16, checkpoint every round, one
torch thread. Start-up is the wall time before round 1 (data, run folder, tracker); bytes written per round are the
files `torch.save` wrote in rounds 2..R (the checkpoint and the changed client states), averaged. The table goes to
stdout and `<out>/scale.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads(1)
from flsuite.data.builtin import GaussianFeatures
from flsuite.federation.phases import Rounds
try:
    from flsuite.federation.run import Federation
    from flsuite.federation.sampling import ClientSampling
except ImportError:  # a commit before the engine renovation (measured side by side: PYTHONPATH=<its worktree>)
    from flsuite.federation.loop import ClientSampling, Federation
from flsuite.federation.task import LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.methods.scaffold import Scaffold
from flsuite.models.heads import MLP
from flsuite.tracking import WandbConfig

n, method, rounds, run_dir = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
written = []  # (round in progress, bytes)
current = {"round": 0}
save = torch.save
def counting_save(obj, f, *args, **kwargs):
    save(obj, f, *args, **kwargs)
    written.append((current["round"], os.path.getsize(f)))
torch.save = counting_save
run_round = Rounds._round
starts = []
def timed_round(self, ctx, rnd, *args, **kwargs):
    current["round"] = rnd
    starts.append(time.perf_counter())
    return run_round(self, ctx, rnd, *args, **kwargs)
Rounds._round = timed_round
fed = Federation(
    data=GaussianFeatures(
        dim=256, num_classes=10, num_domains=1, clients_per_domain=n, samples_per_client=16, test_per_domain=200
    ),
    model=MLP(hidden=(1024, 1024)), method=Scaffold() if method == "scaffold" else FedAvg(), rounds=rounds,
    local=LocalTraining(epochs=1, batch_size=16, lr=0.01, momentum=0.0, weight_decay=0.0),
    sampling=ClientSampling(per_round=10), run_dir=run_dir, progress=False, wandb=WandbConfig(enabled=False),
)
fed.fit()
end = time.perf_counter()
per_round = [b - a for a, b in zip(starts, starts[1:] + [end])]
by_round = {r: sum(b for rr, b in written if rr == r) for r in range(2, rounds + 1)}
import resource
print(json.dumps({"startup_s": starts[0] - t0, "s_per_round": sorted(per_round[1:])[len(per_round[1:]) // 2],
                  "bytes_per_round": sum(by_round.values()) / len(by_round),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_point(n: int, method: str, rounds: int, out: Path) -> dict:
    run_dir = out / f"{method}-{n}"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), method, str(rounds), str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"N={n} {method}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"clients": n, "method": method, **result, "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "scaffold"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_scale"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [
        "| method | N | start-up s | s/round | MB written/round | peak RSS MB | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in args.methods:
        for n in args.clients:
            r = run_point(n, method, args.rounds, args.out)
            rows.append(
                f"| {method} | {n} | {r['startup_s']:.1f} | {r['s_per_round']:.2f} | "
                f"{r['bytes_per_round'] / 1e6:.1f} | {r['peak_rss_mb']:.0f} | {r['wall_s']:.0f} |"
            )
            print(rows[-1], flush=True)
    (args.out / "scale.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
