"""What `local.loop: compiled` pays once per process: the first rounds of the CPU benchmark's FedAvg federation
(benchmarks/cpu_policy.py part 2: 3 clients x 1,200 samples, Linear(1280, 10), 10 epochs at batch 16, 1 thread),
timed one by one. Round 1 compiles; the later rounds show the round without it. Run it twice with the same
`TORCHINDUCTOR_CACHE_DIR` (a new directory first) to see the compilation with an empty and with a filled on-disk cache:

    C=$(mktemp -d); for i in 1 2; do TORCHINDUCTOR_CACHE_DIR=$C python benchmarks/compile_cost.py; done
    python benchmarks/compile_cost.py --loop lean   # the same rounds with the default loop
    ... --optimizer adam   # Adam: the per-batch compiled form (one compiled forward-and-backward per batch)
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from cpu_policy import client_env, flsuite_round, synthetic_federation


def main() -> None:
    from flsuite.federation.local.trainer import _quiet_lightning

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", choices=["compiled", "lean"], default="compiled")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    _quiet_lightning()
    torch.set_num_threads(1)
    env = client_env(synthetic_federation(3, 1200, seed=2), loop=args.loop)
    env.local = dataclasses.replace(env.local, optimizer=args.optimizer)
    weights = env.build_model().state_dict()
    for r in range(1, args.rounds + 1):
        start = time.perf_counter()
        flsuite_round(env, weights)
        print(f"local.loop: {args.loop}, {args.optimizer}, round {r}: {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
