"""Many small client fits: one round's client work of FedEGG's CPU setting (configs/fedegg/cpu/mnist_dir0.1.yaml) on
synthetic features, flsuite against a hand-written loop, and flsuite's fixed cost per fit.

The setting: 3,000 samples over 100 clients by Dirichlet(0.1) label skew, 20 clients a round, each 5 plain-SGD steps
of batch 32 (lr 0.01, no momentum or weight decay) on an MLP(1280 -> 128 -> 10) head over frozen features. Here the
features are random, the labels are split the same way (flsuite.data.partition.Dirichlet, so the clients have the
setting's uneven sizes) and one round's 20 clients are drawn once.

Compared in the same process, alternated round by round (these machines are shared and noisy: only ratios matter):
  flsuite  `run_client` for each of the 20 tasks (loop "lean": `run_fit` of a `ClientFit`, no Trainer),
  plain    a hand-written torch loop over the SAME batches (`client_batches` with the task's seed), the same initial
           model (seeded build + global weights), torch.optim.SGD and F.cross_entropy, returning a CPU copy of the
           weights as a client would; its weights are checked equal to flsuite's.
With `--flower_python`, Flower 1.42 runs the same federation beside them (benchmarks/flower_rounds.py in that python,
one process, after the alternated rounds): the same 100 clients' data, 20 sampled a round by Flower's FedAvg, the same
MLP, 5 steps of batch 32 each, plain SGD, one Ray actor (one core, as the other two); its rounds 2..R's median round
time (client fits plus the engine's messaging) and its clients' summed fit time per round are printed beside them.
Then flsuite's time per fit is split (perf_counter around the functions `run_client` calls, in the real
`run_client`): model build + weight load, the client module and batches, `run_fit` without and with its training
steps, result packing; `--profile` prints cProfile's top functions of the fits as well.

    python benchmarks/small_clients.py [--rounds 15] [--clients 20] [--profile] [--flower_python PYTHON]

Flower pins its own Ray: install it in a venv of its own (`pip install -e . "flwr[simulation]==1.42.0"`) and pass
that venv's python.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import pstats
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

import flsuite.federation.local.client as client_module
from flsuite.data.base import ClientData, FederatedData, Split
from flsuite.data.partition import Dirichlet
from flsuite.federation.local.batches import client_batches
from flsuite.federation.local.client import ClientEnvironment, run_client
from flsuite.federation.local.loops import ClientFit
from flsuite.federation.method import HyperParameters
from flsuite.federation.task import ClientResult, ClientTask, LocalTraining
from flsuite.methods.fedavg import FedAvg
from flsuite.models.heads import MLP


def federation(args: argparse.Namespace) -> tuple[ClientEnvironment, list[ClientTask]]:
    """The setting's data on random features, and one round's `args.clients` tasks from the global weights."""
    g = torch.Generator().manual_seed(0)
    n = args.samples
    x = torch.randn(n, args.dim, generator=g)
    y = torch.randint(0, args.classes, (n,), generator=g)
    parts = Dirichlet(num_clients=args.num_clients, beta=args.beta).split(
        {"d": y.numpy()}, args.classes, np.random.default_rng(0)
    )
    clients = [
        ClientData(i, "d", Split(x[torch.from_numpy(p.indices)], y[torch.from_numpy(p.indices)]))
        for i, p in enumerate(p for p in parts if len(p) > 0)
    ]
    data = FederatedData(clients, {"d": Split(x[:100], y[:100])}, num_classes=args.classes)
    local = LocalTraining(
        steps=args.steps, batch_size=args.batch_size, optimizer="sgd", lr=0.01, momentum=0.0, weight_decay=0.0,
        loop="lean",
    )  # fmt: skip
    env = ClientEnvironment(data, MLP(hidden=[128]), HyperParameters(FedAvg()), local, seed=0)
    torch.manual_seed(0)
    weights = env.build_model().state_dict()
    chosen = np.random.default_rng(1).choice(len(clients), size=args.clients, replace=False)
    return env, [ClientTask(1, int(c), 1000 + int(c), weights) for c in chosen]


def flower_round_seconds(env: ClientEnvironment, args: argparse.Namespace) -> tuple[float, float]:
    """Flower 1.42 on the same federation (benchmarks/flower_rounds.py in `args.flower_python`, one actor): the
    median over rounds 2..R of its round time and of its clients' summed fit time in a round."""
    local = env.local
    data = {
        "clients": [(c.train.x, c.train.y) for c in env.data.clients],
        "test": (env.data.test["d"].x, env.data.test["d"].y),
        "hidden": [128],
        "classes": args.classes,
        "steps": local.steps,
        "per_round": args.clients,
        "batch_size": local.batch_size,
        "lr": local.lr,
        "momentum": local.momentum,
        "weight_decay": local.weight_decay,
        "seed": 0,
        "learnable": False,
    }
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(data, f"{tmp}/data.pt")
        script = Path(__file__).resolve().parent / "flower_rounds.py"
        cmd = [args.flower_python, str(script), "--data", f"{tmp}/data.pt", "--rounds", str(args.rounds)]
        subprocess.run([*cmd, "--out", f"{tmp}/out.json", "--parallel", "1"], check=True)
        out = json.loads(Path(f"{tmp}/out.json").read_text())
    later = slice(1, None) if len(out["round_seconds"]) > 1 else slice(None)
    fits = [sum(round_fits) for round_fits in out["client_fit_seconds"]]
    return statistics.median(out["round_seconds"][later]), statistics.median(fits[later])


def plain_client(env: ClientEnvironment, task: ClientTask) -> dict[str, torch.Tensor]:
    """A hand-written client fit: the same model init and batches as `run_client`, bare torch."""
    torch.manual_seed(task.seed)
    model = env.build_model()
    model.load_state_dict(task.global_weights)
    local = env.local
    opt = torch.optim.SGD(model.parameters(), lr=local.lr, momentum=local.momentum, weight_decay=local.weight_decay)
    batches, _ = client_batches(env.data.clients[task.client_id].train, local, task.seed)
    for epoch in batches:
        for x, y in epoch:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Parts(contextlib.ExitStack):
    """perf_counter totals of the functions `run_client` calls, by wrapping them where `run_client` looks them up
    (`unittest.mock.patch.object`, undone when the block ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                self.seconds[label] += time.perf_counter() - t0

        self.enter_context(mock.patch.object(owner, name, timed))

    def __enter__(self) -> Parts:
        super().__enter__()
        self.wrap(ClientEnvironment, "build_model", "model build")
        self.wrap(client_module, "load_task_weights", "weight load")
        self.wrap(client_module, "client_batches", "client batches")
        self.wrap(client_module, "run_fit", "run_fit")
        self.wrap(ClientFit, "train_epoch", "training steps")
        self.wrap(client_module, "client_result", "result packing")
        return self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds of each runner (alternated)")
    ap.add_argument("--clients", type=int, default=20, help="clients per round")
    ap.add_argument("--num_clients", type=int, default=100)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions of 3 rounds")
    ap.add_argument("--flower_python", help="a python with flwr[simulation] 1.42 (and flsuite): Flower beside them")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env, tasks = federation(args)

    def flsuite_round() -> list[ClientResult]:
        return [run_client(env, t) for t in tasks]

    def plain_round() -> list[dict[str, torch.Tensor]]:
        return [plain_client(env, t) for t in tasks]

    ours, theirs = flsuite_round(), plain_round()  # warm-up, and the check that both train the same
    same = all(all(torch.equal(r.weights[k], w[k]) for k in w) for r, w in zip(ours, theirs, strict=True))
    runners = {"plain": plain_round, "flsuite": flsuite_round}
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    sizes = sorted(len(env.data.clients[t.client_id].train) for t in tasks)
    print(
        f"MLP({args.dim} -> 128 -> {args.classes}), {args.clients} clients of {sizes[0]}-{sizes[-1]} samples "
        f"(median {sizes[len(sizes) // 2]}), {args.steps} steps of batch {args.batch_size}, 1 thread, "
        f"median of {args.rounds} rounds; weights equal to plain: {same}"
    )
    ref = statistics.median(times["plain"])
    print(f"{'runner':<10}{'round (ms)':>12}{'per fit (ms)':>14}{'x plain':>9}")
    for name in runners:
        t = statistics.median(times[name])
        print(f"{name:<10}{1000 * t:>12.1f}{1000 * t / args.clients:>14.2f}{t / ref:>9.2f}")
    if args.flower_python:
        flower_round, flower_fits = flower_round_seconds(env, args)
        print(
            f"{'Flower':<10}{1000 * flower_round:>12.1f}{1000 * flower_round / args.clients:>14.2f}"
            f"{flower_round / ref:>9.2f}  (its clients' fits alone: {1000 * flower_fits:.1f} ms a round,"
            f" {flower_fits / ref:.2f} x plain)"
        )

    fits = args.rounds * args.clients
    with Parts() as parts:
        t0 = time.perf_counter()
        for _ in range(args.rounds):
            flsuite_round()
        total = time.perf_counter() - t0
    s = parts.seconds
    rows = {
        "model build": s["model build"],
        "weight load": s["weight load"],
        "client batches": s["client batches"],
        "run_fit beyond the steps": s["run_fit"] - s["training steps"],
        "training steps": s["training steps"],
        "result packing": s["result packing"],
    }
    rows["rest of run_client"] = total - sum(rows.values())
    print(
        f"\nflsuite per fit, {fits} fits (perf_counter around run_client's calls; total {1000 * total / fits:.2f} ms)"
    )
    for label, sec in rows.items():
        print(f"  {label:<30}{1000 * sec / fits:>8.3f} ms")
    print(f"  {'plain fit, for reference':<30}{1000 * ref / args.clients:>8.3f} ms")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(3):
            flsuite_round()
        profiler.disable()
        print(f"\ncProfile of 3 flsuite rounds ({3 * args.clients} fits), by cumulative time:")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
