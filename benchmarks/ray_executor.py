"""SerialExecutor vs RayExecutor on one machine.

(a) speed-up: 8 clients (UCI digits, 4 domains × 2 clients) each training a SmallCNN for a few local epochs;
    serial uses torch's default intra-op threads, Ray one worker per CPU with 1 torch thread each
    (target: ≥ 1.6× on 2 cores).
(b) overhead: a tiny linear head over GaussianFeatures, where a client fit takes milliseconds, so the round time is
    mostly executor overhead (target: Ray at most 20% slower than serial).

Per-round times come from each run's timings.jsonl (`time/clients_s` = the executor's part of the round,
`time/round_s` = the whole round incl. aggregation and evaluation). Ray's worker start-up happens once per run
(in `executor.start`) and is reported separately. Shared machines are noisy: compare ratios, run more rounds.

    python benchmarks/ray_executor.py [--num_cpus 2] [--rounds 3] [--epochs 3] [--overhead_rounds 10] [--reps 2]
    [--skip_cnn]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402

from flsuite.data.builtin import GaussianFeatures, UCIDigitsDomains  # noqa: E402
from flsuite.federation.executors import SerialExecutor  # noqa: E402
from flsuite.federation.ray_executor import RayExecutor  # noqa: E402
from flsuite.federation.run import Federation  # noqa: E402
from flsuite.federation.task import LocalTraining  # noqa: E402
from flsuite.models.heads import Linear, SmallCNN  # noqa: E402
from flsuite.tracking import WandbConfig  # noqa: E402


def run(kind: str, executor, workdir: Path, **kwargs) -> dict[str, float]:
    run_dir = workdir / kind
    fed = Federation(executor=executor, run_dir=run_dir, progress=False, wandb=WandbConfig(enabled=False), **kwargs)
    t0 = time.perf_counter()
    fed.fit()
    wall = time.perf_counter() - t0
    timings = [json.loads(line) for line in (run_dir / "timings.jsonl").read_text().splitlines()]
    rounds = [t["time/round_s"] for t in timings]
    clients = [t["time/clients_s"] for t in timings]
    return {
        "wall": wall,
        "round": statistics.mean(rounds),
        "clients": statistics.mean(clients),
        "clients_after_1": statistics.mean(clients[1:]) if len(clients) > 1 else clients[0],
        "outside_rounds": wall - sum(rounds),
        "metrics": (run_dir / "metrics.jsonl").read_text(),
    }


def report(title: str, serial: dict, ray_: dict) -> None:
    print(f"\n{title}")
    print(f"  {'':8s} {'round_s':>9s} {'clients_s':>10s} {'clients_s(r>=2)':>16s} {'start+end_s':>12s} {'wall_s':>8s}")
    for name, r in (("serial", serial), ("ray", ray_)):
        print(
            f"  {name:8s} {r['round']:9.3f} {r['clients']:10.3f} {r['clients_after_1']:16.3f} "
            f"{r['outside_rounds']:12.2f} {r['wall']:8.2f}"
        )
    print(
        f"  speed-up serial/ray: round {serial['round'] / ray_['round']:.2f}x, "
        f"clients {serial['clients'] / ray_['clients']:.2f}x, "
        f"clients (rounds>=2) {serial['clients_after_1'] / ray_['clients_after_1']:.2f}x"
    )
    print(f"  identical metrics.jsonl: {serial['metrics'] == ray_['metrics']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num_cpus", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--overhead_rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2, help="alternated serial/Ray repetitions of (b)")
    ap.add_argument("--skip_cnn", action="store_true", help="only the overhead part (b)")
    args = ap.parse_args()

    import ray

    warnings.filterwarnings("ignore", message=r".*LeafSpec.*")

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"torch threads (serial): {torch.get_num_threads()}; Ray: {args.num_cpus} CPUs, 1 worker per CPU, "
        f"1 thread each; load average: {os.getloadavg()}"
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            cnn = (
                None
                if args.skip_cnn
                else dict(
                    data=UCIDigitsDomains(clients_per_domain=2),
                    model=SmallCNN(),
                    rounds=args.rounds,
                    seed=0,
                    local=LocalTraining(epochs=args.epochs, batch_size=16, lr=0.05),
                )
            )
            if cnn is not None:
                serial = run("cnn_serial", SerialExecutor(), work, **cnn)
                ray_ = run("cnn_ray", RayExecutor(torch_threads=1), work, **cnn)
                report(
                    f"(a) 8 clients × SmallCNN on UCI digits, {args.epochs} local epochs, {args.rounds} rounds",
                    serial,
                    ray_,
                )

            head = dict(
                data=GaussianFeatures(
                    dim=16, num_classes=4, num_domains=2, clients_per_domain=2, samples_per_client=100
                ),
                model=Linear(),
                rounds=args.overhead_rounds,
                seed=0,
                local=LocalTraining(epochs=1, batch_size=16, lr=0.05),
            )
            # serial with 1 torch thread too, so only the executor differs; alternated, as the machine is noisy
            default_threads = torch.get_num_threads()
            torch.set_num_threads(1)
            ratios = []
            for rep in range(args.reps):
                serial = run(f"head_serial{rep}", SerialExecutor(), work, **head)
                ray_ = run(f"head_ray{rep}", RayExecutor(torch_threads=1), work, **head)
                report(
                    f"(b) overhead, rep {rep + 1}: 4 clients × linear head on GaussianFeatures, "
                    f"{args.overhead_rounds} rounds, serial with 1 torch thread",
                    serial,
                    ray_,
                )
                ratios.append(ray_["round"] / serial["round"])
            torch.set_num_threads(default_threads)
            print(
                f"  ray/serial round time per rep: {[round(r, 2) for r in ratios]}, "
                f"median {statistics.median(ratios):.2f} (target <= 1.20)"
            )
            print(f"load average after: {os.getloadavg()}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
