"""Would vectorising a round's clients reach the closed-form loop? A prototype, measured against it.

K clients of the CPU benchmark's synthetic features (1,200 samples each, Linear(1280, 10), 10 epochs at batch 16,
SGD momentum 0.9 + weight decay 1e-5, 1 thread) trained in lockstep: their heads stacked ([K, 10, 1280] and
[K, 10]), each step one compiled call of `torch.func.grad` of the summed per-client cross-entropies (`baddbmm`; the
clients are independent, so each gets its own gradient) and one fused SGD update of the stacked tensors. No
Lightning, no method hooks: an upper bound on what a vectorising executor could gain. Alternated with the
benchmark's closed-form loop over the same clients and batches; medians of 5.

    python benchmarks/lockstep_prototype.py [--clients 3 10 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cpu_policy
import torch
import torch.nn.functional as F
from torch.optim.sgd import sgd as functional_sgd

from flsuite.data.base import EpochBatches
from flsuite.seeding import torch_generator


def lockstep_round(fed, weights, grad) -> None:
    k = len(fed.clients)
    w, b = weights["1.weight"].expand(k, -1, -1).clone(), weights["1.bias"].expand(k, -1).clone()
    buffers: list = [None, None]
    streams = [
        EpochBatches(c.train, cpu_policy.BATCH, torch_generator(100 + i, purpose="batches"), epochs=cpu_policy.EPOCHS)
        for i, c in enumerate(fed.clients)
    ]
    for _ in range(cpu_policy.EPOCHS):
        epochs = [s.epoch() for s in streams]
        for step in range(len(epochs[0])):
            x, y = torch.stack([e[step][0] for e in epochs]), torch.stack([e[step][1] for e in epochs])
            gw, gb = grad(w, b, x, y)
            with torch.no_grad():
                functional_sgd(
                    [w, b],
                    [gw, gb],
                    buffers,
                    weight_decay=1e-5,
                    momentum=0.9,
                    lr=0.01,
                    dampening=0.0,
                    nesterov=False,
                    maximize=False,
                    foreach=False,
                    fused=True,
                    has_sparse_grad=False,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[3, 10, 30])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        "| clients | lockstep: µs per client-step | closed form: µs per client-step | lockstep / closed form |\n"
        "|---|---|---|---|"
    )
    for k in args.clients:
        fed = cpu_policy.synthetic_federation(k, 1200, seed=2)
        env = cpu_policy.client_env(fed)
        weights = env.build_model().state_dict()

        def summed_loss(w, b, x, y, k=k):
            logits = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
            return (
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
                .view(k, -1)
                .mean(1)
                .sum()
            )

        grad = torch.compile(torch.func.grad(summed_loss, argnums=(0, 1)), fullgraph=True, dynamic=False)
        runs = {
            "lockstep": lambda fed=fed, weights=weights, grad=grad: lockstep_round(fed, weights, grad),
            "closed form": lambda env=env, weights=weights: cpu_policy.closed_form_loop(env, weights),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for fn in runs.values():
            fn()  # compile, warm up
        for _ in range(args.reps):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        steps = k * cpu_policy.EPOCHS * -(-1200 // cpu_policy.BATCH)
        med = {name: 1e6 * statistics.median(t) / steps for name, t in times.items()}
        print(
            f"| {k} | {med['lockstep']:.0f} | {med['closed form']:.0f} | {med['lockstep'] / med['closed form']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
