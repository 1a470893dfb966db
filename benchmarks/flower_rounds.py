"""Flower 1.42's per-round wall time for a small FedAvg federation with a plain torch client (the reference for
flsuite).

The federation: `torch.nn.Linear(features, classes)` on cached features (with DATA.pt's optional `hidden`, an MLP:
Linear, ReLU per hidden width, then Linear), one Flower SuperNode per client in DATA.pt, every client in every round
(FedAvg, fraction 1.0, min nodes = number of clients, weighted by n_k; with the optional `per_round`, that many
clients sampled each round by Flower's FedAvg), no federated evaluation. Each client round: load the global weights,
`epochs` epochs over its data (or, with the optional `steps`, that many mini-batches, reshuffling when the data runs
out) in mini-batches of `batch_size` in an order drawn from a torch.Generator seeded from (seed, round, client)
(`flsuite.seeding.torch_generator(seed, round, client, "batches")`, Flower's rounds count from 1),
torch.optim.SGD(lr, momentum, weight_decay), F.cross_entropy, a plain autograd loop; reply with the updated weights
and n_k.

Flower API (read from the installed 1.42.0 package): the Message API, run in-process by the simulation engine's Ray
backend through `flwr.simulation.run_simulation` (deprecated in 1.42 in favour of `flwr run`: calling it logs a
deprecation warning, but it is still the Python entry point to the same engine):
  client  `flwr.clientapp.ClientApp` with `@app.train()`, a function (Message, Context) -> Message; the client's
          partition is `context.node_config["partition-id"]`, the weights travel as an `ArrayRecord`, n_k as
          `MetricRecord["num-examples"]`;
  server  `flwr.serverapp.ServerApp` with `@app.main()`, running `flwr.serverapp.strategy.FedAvg.start(grid, ...)`;
  engine  `backend_config = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": parallel,
          "include_dashboard": False, "logging_level": ERROR, "log_to_driver": False, ...}}`, so Ray starts `parallel`
          actors (one torch thread each) that serve the clients; with 3 clients and 2 actors a round is two waves.

Timing: a FedAvg subclass stamps time.perf_counter() at the end of each round's aggregation (the round's last step:
federated evaluation is off, so configure_evaluate sends nothing); round r = stamp r - stamp r-1, stamp 0 being the
entry of the ServerApp's main. Round 1 therefore includes Ray's start-up and the actors' creation (the engine builds
them while the ServerApp has already sent round 1), and each process's first load of DATA.pt. `total_seconds` is the
whole `run_simulation` call (Ray start to Ray shutdown). Clients report when their call ran (wall clock, same machine),
so the JSON also has each round's engine overhead: the part of the round in which no client function was running
(messaging, (de)serialisation, Ray dispatch, the grid's 0.1 s reply polling, aggregation), and for round 1 how long
the engine took before the first client started.

Data: the client functions live in this module imported under its own name (`flower_rounds`, not `__main__`), so
cloudpickle sends them to the actors by reference and the module-level cache survives between rounds: DATA.pt is
loaded once per actor process (each actor may serve any client), not per round; the JSON reports the loads and their
cost. What does travel every round is the Message (global weights in, updated weights out) and the Context.

    pip install -e . "flwr[simulation]==1.42.0"   # a separate venv: Flower and flsuite (for flsuite.seeding) python
    benchmarks/flower_rounds.py --data DATA.pt --rounds 10 --out OUT.json [--parallel 2] [--make_data] [--verbose]

The script sets RAY_USAGE_STATS_ENABLED=0, HF_HUB_OFFLINE=1 and FLWR_TELEMETRY_ENABLED=0 itself (unless already set).
With FLOWER_KEEP_FREED_MEMORY=1 every process that imports it (the driver and the Ray actors) first applies
`flsuite.runtime.keep_freed_memory`, as benchmarks/default_loop.py does for every contender.

`--make_data` first writes a demo DATA.pt at --data (3 clients x 1200 samples of randn(1280) features, labels from a
random linear teacher over 10 classes, a 2000-sample test split, epochs 10, batch 16, lr 0.01, momentum 0.9,
weight decay 1e-5, seed 0). The caller takes the median of rounds 2..R.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault(
    "FLWR_TELEMETRY_ENABLED", "0"
)  # flwr otherwise posts events to telemetry.flower.ai (no internet here)
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences Ray 2.5x's FutureWarning about num_gpus=0

import flwr  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, MetricRecordValues, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from flsuite.runtime import keep_freed_memory  # noqa: E402
from flsuite.seeding import torch_generator  # noqa: E402

if (
    os.environ.get("FLOWER_KEEP_FREED_MEMORY") == "1"
):  # benchmarks/default_loop.py: the allocator setting every contender gets
    keep_freed_memory()

FEATURES, CLASSES = 1280, 10  # the demo federation's (--make_data)


def make_model(data: dict[str, Any]) -> torch.nn.Module:
    """Linear(features, classes), or with `hidden` an MLP of Linear + ReLU layers of those widths, then Linear."""
    x, y = data["test"]
    widths = [x.shape[1], *data.get("hidden", [])]
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], int(data.get("classes", CLASSES))))


# --- client side: runs in the Ray actor processes --------------------------------------------------------------------

_DATA: dict[str, dict[str, Any]] = {}  # DATA.pt path -> its contents, loaded once per process


def cached_data(path: str) -> tuple[dict[str, Any], float]:
    """DATA.pt's contents for this process and the seconds this call spent loading them (0.0 when cached)."""
    if path in _DATA:
        return _DATA[path], 0.0
    t0 = time.perf_counter()
    _DATA[path] = torch.load(path)
    return _DATA[path], time.perf_counter() - t0


def local_train(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, data: dict[str, Any], generator: torch.Generator
) -> float:
    """`epochs` epochs (or `steps` batches) of shuffled mini-batch SGD; returns the mean loss of the last epoch (of
    the steps)."""
    opt = torch.optim.SGD(
        model.parameters(), lr=data["lr"], momentum=data["momentum"], weight_decay=data["weight_decay"]
    )
    batch_size, steps = int(data["batch_size"]), data.get("steps")
    per_epoch = -(-len(y) // batch_size)
    total = int(steps) if steps is not None else int(data["epochs"]) * per_epoch
    batches: list[torch.Tensor] = []
    while len(batches) < total:  # one shuffled order per pass over the data
        batches += torch.randperm(len(y), generator=generator).split(batch_size)
    losses = []
    for idx in batches[:total]:
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append((loss.item() * len(idx), len(idx)))
    reported = losses if steps is not None else losses[-per_epoch:]
    return sum(s for s, _ in reported) / sum(n for _, n in reported)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One client round: global weights in, `epochs` local epochs, updated weights and n_k out."""
    t0, start = time.perf_counter(), time.time()
    torch.set_num_threads(1)
    config = msg.content.config_records["config"]
    data, load_s = cached_data(str(config["data-path"]))
    client, rnd = int(context.node_config["partition-id"]), cast(int, config["server-round"])
    x, y = data["clients"][client]
    model = make_model(data)
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    t1 = time.perf_counter()
    loss = local_train(model, x, y, data, torch_generator(int(data["seed"]), rnd, client, "batches"))
    t2 = time.perf_counter()
    metrics: dict[str, MetricRecordValues] = {
        "num-examples": len(y),
        "train-loss": loss,
        "fit-s": t2 - t1,
        "setup-s": t1 - t0,
        "load-s": load_s,
        "client": client,
        "pid": os.getpid(),
    }
    metrics |= {"start-t": start, "end-t": start + (t2 - t0)}  # wall clock, to compare with the server's stamps
    return Message(
        content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}), reply_to=msg
    )


# --- server side: runs in this process (the ServerApp in a thread of run_simulation) --------------------------------


class TimedFedAvg(FedAvg):
    """FedAvg over `per_round` of the clients every round (all by default) that stamps the end of each round and
    keeps the clients' reports."""

    def __init__(self, num_clients: int, per_round: int | None = None) -> None:
        per_round = per_round or num_clients
        super().__init__(
            fraction_train=per_round / num_clients,
            fraction_evaluate=0.0,
            min_train_nodes=per_round,
            min_available_nodes=num_clients,
        )
        self.num_clients = per_round  # the replies a round must have
        self.stamps: list[float] = []  # perf_counter at [main entry, end of round 1, end of round 2, ...]
        self.wall: list[float] = []  # the same moments in time.time()
        self.reports: list[list[dict[str, Any]]] = []  # per round, each client's train metrics

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        errors = [msg.error.reason for msg in replies if msg.has_error()]
        if errors or len(replies) != self.num_clients:
            raise RuntimeError(
                f"round {server_round}: {len(replies)} replies for {self.num_clients} clients, errors: {errors}"
            )
        self.reports.append(sorted((dict(msg.content["metrics"]) for msg in replies), key=lambda m: m["client"]))
        out = super().aggregate_train(server_round, replies)
        self.stamps.append(time.perf_counter())
        self.wall.append(time.time())
        return out


def make_server_app(
    strategy: TimedFedAvg, data: dict[str, Any], data_path: str, rounds: int, seed: int, result: dict[str, ArrayRecord]
) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.stamps.append(time.perf_counter())
        strategy.wall.append(time.time())
        torch.manual_seed(seed)
        initial = ArrayRecord(make_model(data).state_dict())
        out = strategy.start(
            grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=ConfigRecord({"data-path": data_path})
        )
        result["arrays"] = out.arrays

    return app


def backend_config(parallel: int) -> dict[str, Any]:
    """One CPU per client and `parallel` CPUs for Ray: `parallel` actors train side by side; no dashboard, quiet
    logs."""
    init_args = {
        "num_cpus": parallel,
        "num_gpus": 0,
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
    }
    return {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": init_args}


# --- driver ----------------------------------------------------------------------------------------------------------


def make_demo_data(path: Path, clients: int = 3, samples: int = 1200, test: int = 2000, seed: int = 0) -> None:
    """The demo federation: randn features, labels from a random linear teacher over 10 classes."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, FEATURES, generator=gen)
        return x, (x @ teacher).argmax(1)

    data = {
        "clients": [split(samples) for _ in range(clients)],
        "test": split(test),
        "epochs": 10,
        "batch_size": 16,
        "lr": 0.01,
    }
    data |= {"momentum": 0.9, "weight_decay": 1e-5, "seed": seed}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)


def accuracy(arrays: ArrayRecord, data: dict[str, Any]) -> float:
    x, y = data["test"]
    model = make_model(data)
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of the intervals."""
    total, reach = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        total, reach = total + max(0.0, hi - max(lo, reach)), max(reach, hi)
    return total


def summarise(strategy: TimedFedAvg) -> dict[str, Any]:
    """Per-round times, the clients' fit times, and the part of each round in which no client function ran."""
    rounds = [b - a for a, b in zip(strategy.stamps, strategy.stamps[1:])]
    fits = [[m["fit-s"] for m in reports] for reports in strategy.reports]
    busy = [covered([(m["start-t"], m["end-t"]) for m in reports]) for reports in strategy.reports]
    loads = [(int(m["pid"]), m["load-s"]) for reports in strategy.reports for m in reports if m["load-s"] > 0]
    return {
        "round_seconds": rounds,
        "client_fit_seconds": fits,
        "overhead_seconds": [r - b for r, b in zip(rounds, busy)],
        "engine_startup_seconds": min(m["start-t"] for m in strategy.reports[0]) - strategy.wall[0]
        if strategy.reports
        else None,
        "train_loss": [statistics.fmean(m["train-loss"] for m in reports) for reports in strategy.reports],
        "actor_pids": sorted({int(m["pid"]) for reports in strategy.reports for m in reports}),
        "data_loads": [{"pid": pid, "seconds": s} for pid, s in loads],
    }


def simulate(
    data_path: str, data: dict[str, Any], rounds: int, parallel: int
) -> tuple[TimedFedAvg, dict[str, ArrayRecord], float, float]:
    """Run the federation; returns the strategy (with its stamps), the final arrays, run_simulation's start and wall
    time."""
    strategy, result = TimedFedAvg(len(data["clients"]), data.get("per_round")), dict[str, ArrayRecord]()
    server_app = make_server_app(strategy, data, data_path, rounds, int(data["seed"]), result)
    t0 = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=len(data["clients"]),
        backend_config=backend_config(parallel),
    )
    return strategy, result, t0, time.perf_counter() - t0


def notes(parallel: int, data: dict[str, Any], stats: dict[str, Any]) -> str:
    loads = stats["data_loads"]
    return (
        f"Flower {flwr.__version__} Message API (ClientApp @train, ServerApp @main, flwr.serverapp.strategy.FedAvg) "
        "via flwr.simulation.run_simulation (deprecated in 1.42, warns), Ray backend, "
        f"{parallel} actor(s) x 1 CPU, 1 torch thread; "
        f"{len(data['clients'])} clients ({data.get('per_round') or len(data['clients'])} a round), "
        + (f"{data['steps']} local steps" if data.get("steps") else f"{data['epochs']} local epochs")
        + f" at batch {data['batch_size']}; "
        "round = perf_counter between consecutive "
        "aggregations (round 1 from the ServerApp's start, so it includes Ray's start-up and the actors' creation: "
        f"{stats['engine_startup_seconds']:.1f} s before the first client call); DATA.pt loaded once per "
        f"actor process ({len(loads)} loads, {sum(d['seconds'] for d in loads):.3f} s in all), not per round; "
        "the in-memory grid polls for replies every 0.1 s."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="torch.save'd dict: clients, test, epochs, batch_size, lr, momentum, weight_decay, seed; optional "
        "hidden, steps, per_round, classes, learnable (false: no accuracy check)",
    )
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--parallel", type=int, default=2, help="clients training side by side (Ray actors, 1 CPU each)"
    )
    parser.add_argument("--make_data", action="store_true", help="first write the demo federation at --data")
    parser.add_argument("--verbose", action="store_true", help="keep Flower's INFO log (round banners)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    if not args.verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    if args.make_data:
        make_demo_data(args.data)
    data_path = str(args.data.resolve())
    data = torch.load(data_path)

    strategy, result, t0, total = simulate(data_path, data, args.rounds, args.parallel)
    stats = summarise(strategy)
    acc = accuracy(result["arrays"], data) if "arrays" in result else float("nan")
    chance = 1.0 / int(data.get("classes", CLASSES))
    checks = {"rounds_ok": len(stats["round_seconds"]) == args.rounds}
    if data.get("learnable", True):  # random labels (benchmarks/small_clients.py) have nothing to learn
        checks["accuracy_ok"] = acc > 2 * chance
    out = {
        "round_seconds": stats.pop("round_seconds"),
        "total_seconds": total,
        "flwr_version": flwr.__version__,
        "parallel": args.parallel,
    }
    out |= {
        "notes": notes(args.parallel, data, stats),
        "rounds": args.rounds,
        "num_clients": len(data["clients"]),
        "test_accuracy": acc,
    }
    out |= {"shutdown_seconds": t0 + total - strategy.stamps[-1], **stats, **checks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")

    rounds, overhead = out["round_seconds"], stats["overhead_seconds"]
    print(
        f"flwr {flwr.__version__} parallel={args.parallel} clients={len(data['clients'])} "
        f"rounds={len(rounds)}/{args.rounds}: "
        f"round s [{' '.join(f'{t:.3f}' for t in rounds)}], "
        f"median(2..R) {statistics.median(rounds[1:] or rounds):.3f} s, "
        f"overhead median(2..R) {statistics.median(overhead[1:] or overhead):.3f} s, "
        f"engine start-up {stats['engine_startup_seconds']:.1f} s, "
        f"total {total:.2f} s, test acc {acc:.3f} (chance {chance:.2f}) -> {args.out}"
    )
    if not all(checks.values()):
        sys.exit(f"check failed: {checks}")


if __name__ == "__main__":
    # Run as the module `flower_rounds`, not `__main__`, so the ClientApp's functions reach the Ray actors by reference
    # (they import this file; its folder is on sys.path, which Flower hands to Ray as PYTHONPATH) and _DATA persists.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    importlib.import_module(Path(__file__).stem).main()
