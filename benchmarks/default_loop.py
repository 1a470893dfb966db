"""The default loop's round against its limit and against Flower (issue 26), side by side in one run.

One federation, digits_offline-like: 3 clients × `--samples` 1280-d features (a random linear teacher plus noise,
10 classes; `cpu_policy.synthetic_federation`), Linear(1280, 10), FedAvg, 10 local epochs at batch 16, SGD lr 0.01
momentum 0.9 weight decay 1e-5, every client every round, `--rounds` rounds, 1 torch thread. Each repetition runs,
each in a fresh process, in the order A B C, then C B A in the next:

  flsuite     `Federation.fit` with the default `local.loop` (auto: it logs its choice, reported below), the
              seconds per round from the run's own `time/round_s` (evaluation only after the last round);
  closed form the same rounds with the softmax-cross-entropy gradient written out (no autograd, no torch.optim,
              no framework): the limit;
  Flower      Flower's `run_simulation` with a plain torch client (benchmarks/flower_rounds.py), 2 clients in
              parallel on the machine's 2 cores; needs the `bench` extra (`pip install -e ".[bench]"`, which
              pins its own Ray: use a separate venv and pass its python as `--flower_python`).

Every process (the Flower clients' too) first asks glibc to keep freed memory (`flsuite.runtime.keep_freed_memory`,
what `flsuite fit` does at start): an epoch's gathered batches then reuse memory instead of faulting in fresh pages.

Reported: the median seconds of rounds 2..R-1 of each (round 1 holds start-up and, for flsuite, the compilation;
round R flsuite's evaluation), per repetition, and the ratios flsuite / closed form (target <= 1.2) and flsuite /
Flower (target <= 0.5). With `--quickstart_baseline DIR` (the source tree of an earlier commit, e.g. a `git worktree`)
also the quickstart's wall time with this tree against that one, alternated (target: not worse by more than 10%).

    python benchmarks/default_loop.py [--rounds 25] [--reps 2] [--flower_python /path/to/bench-venv/bin/python] \\
        [--quickstart_baseline /tmp/base]
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

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EPOCHS, BATCH, LR, MOMENTUM, WEIGHT_DECAY = 10, 16, 0.01, 0.9, 1e-5
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MPLBACKEND": "Agg",
}


def write_data(path: Path, samples: int) -> None:
    """The federation as tensors, for every contender (benchmarks/flower_rounds.py reads the same file)."""
    sys.path.insert(0, str(HERE))
    from cpu_policy import synthetic_federation

    fed = synthetic_federation(3, samples, seed=2)
    torch.save(
        {
            "clients": [(c.train.x, c.train.y) for c in fed.clients],
            "test": (fed.test["d"].x, fed.test["d"].y),
            "epochs": EPOCHS,
            "batch_size": BATCH,
            "lr": LR,
            "momentum": MOMENTUM,
            "weight_decay": WEIGHT_DECAY,
            "seed": 0,
        },
        path,
    )


# ---- children: one contender's rounds in a fresh process ------------------------------------------------------
def flsuite_rounds(data: Path, rounds: int, out: Path) -> dict:
    from flsuite.data.base import DataSource, FederatedData
    from flsuite.federation.run import Federation
    from flsuite.federation.task import LocalTraining
    from flsuite.methods.fedavg import FedAvg
    from flsuite.models.heads import Linear
    from flsuite.tracking import WandbConfig

    class SavedFeatures(DataSource):
        def build(self, seed: int) -> FederatedData:
            return saved_federation(data)

    run_dir = out.with_suffix("")
    local = LocalTraining(epochs=EPOCHS, batch_size=BATCH, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    fed = Federation(
        data=SavedFeatures(),
        model=Linear(),
        method=FedAvg(),
        local=local,
        rounds=rounds,
        seed=0,
        eval_every=rounds,
        run_dir=run_dir,
        progress=False,
        wandb=WandbConfig(enabled=False),
    )
    fed.fit()
    records = [json.loads(line) for line in (run_dir / "timings.jsonl").read_text().splitlines()]
    loop = json.loads((run_dir / "environment.json").read_text())["local_loop"]
    return {"round_seconds": [r["time/round_s"] for r in records if "time/round_s" in r], "loop": loop}


def saved_federation(data: Path):
    from flsuite.data.base import ClientData, FederatedData, Split

    saved = torch.load(data)
    clients = [ClientData(k, "d", Split(x, y)) for k, (x, y) in enumerate(saved["clients"])]
    return FederatedData(clients, {"d": Split(*saved["test"])}, num_classes=10)


def closed_form_rounds(data: Path, rounds: int, out: Path) -> dict:
    """FedAvg rounds with `cpu_policy.closed_form_loop` as every client's fit, then the sample-weighted average."""
    sys.path.insert(0, str(HERE))
    from cpu_policy import client_env, closed_form_loop

    env = client_env(saved_federation(data))
    weights = {k: v.detach().clone() for k, v in env.build_model().state_dict().items()}
    share = torch.tensor([len(c.train) for c in env.data.clients], dtype=torch.float32)
    share /= share.sum()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fits = closed_form_loop(env, weights)
        weights = {k: sum(f[k] * s for f, s in zip(fits, share)) for k in weights}
        seconds.append(time.perf_counter() - start)
    return {"round_seconds": seconds}


CHILDREN = {"flsuite": flsuite_rounds, "closed form": closed_form_rounds}


def child(name: str, data: Path, rounds: int, out: Path) -> None:
    from flsuite.runtime import keep_freed_memory

    # as `flsuite fit` does at start (cli.main); the Flower clients get it too (FLOWER_KEEP_FREED_MEMORY)
    keep_freed_memory()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    out.write_text(json.dumps(CHILDREN[name](data, rounds, out)))


# ---- the parent: alternated fresh processes, the table --------------------------------------------------------
def run_contender(name: str, data: Path, rounds: int, work: Path, rep: int, flower_python: str | None) -> dict:
    out = work / f"{name.replace(' ', '_')}-{rep}.json"
    env = (
        os.environ
        | CHILD_ENV
        | {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
    )
    if name == "Flower":
        env["FLOWER_KEEP_FREED_MEMORY"] = "1"
        cmd = [
            flower_python or sys.executable,
            str(HERE / "flower_rounds.py"),
            "--data",
            str(data),
            "--rounds",
            str(rounds),
            "--out",
            str(out),
        ]
    else:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--data",
            str(data),
            "--rounds",
            str(rounds),
            "--out",
            str(out),
        ]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["process_seconds"] = time.perf_counter() - start
    return result


def steady(seconds: list[float]) -> float:
    """The median of rounds 2..R-1: no start-up, compilation or final evaluation."""
    return statistics.median(seconds[1:-1] if len(seconds) > 3 else seconds[1:])


def quickstart_walls(baseline: Path, reps: int) -> list[tuple[float, float]]:
    """(this tree, the baseline tree) wall seconds of `flsuite fit --config configs/quickstart.yaml`, alternated."""
    walls = []
    for rep in range(reps):
        order = [ROOT, baseline] if rep % 2 == 0 else [baseline, ROOT]
        got = {}
        for tree in order:
            env = os.environ | CHILD_ENV | {"PYTHONPATH": str(tree)}
            cmd = [
                sys.executable,
                "-c",
                "from flsuite.cli import main; raise SystemExit(main())",
                "fit",
                "--config",
                str(ROOT / "configs/quickstart.yaml"),
            ]
            cmd += ["--run_dir", tempfile.mkdtemp(), "--progress", "false", "--wandb.enabled", "false"]
            start = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True)
            got[tree] = time.perf_counter() - start
        walls.append((got[ROOT], got[baseline]))
        print(
            f"quickstart, repetition {rep + 1}: this tree {got[ROOT]:.1f} s, baseline {got[baseline]:.1f} s "
            f"({got[ROOT] / got[baseline]:.3f}x)",
            flush=True,
        )
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1200)
    ap.add_argument(
        "--flower_python", default=None, help="a python with flwr[simulation] installed (default: this one)"
    )
    ap.add_argument("--no_flower", action="store_true")
    ap.add_argument("--quickstart_baseline", type=Path, default=None)
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.data, args.rounds, args.out)

    work = Path(tempfile.mkdtemp(prefix="default_loop-"))
    data = work / "data.pt"
    write_data(data, args.samples)
    names = ["flsuite", "closed form"] + ([] if args.no_flower else ["Flower"])
    rows = []
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        got = {name: run_contender(name, data, args.rounds, work, rep, args.flower_python) for name in order}
        row = {name: steady(r["round_seconds"]) for name, r in got.items()}
        rows.append(row)
        loop = got["flsuite"]["loop"]
        print(
            f"repetition {rep + 1} ({' '.join(order)}): " + ", ".join(f"{n} {s:.3f} s/round" for n, s in row.items()),
            flush=True,
        )
        print(
            f"  flsuite's loop: {loop['loop']} ({loop['reason']}); round 1: {got['flsuite']['round_seconds'][0]:.2f} s",
            flush=True,
        )
    print(
        f"\n{args.rounds} rounds, 3 clients x {args.samples} samples, Linear(1280, 10), "
        f"{EPOCHS} epochs at batch {BATCH}; median s/round of rounds 2..R-1\n"
    )
    header = (
        "| repetition | "
        + " | ".join(names)
        + " | flsuite / closed form | "
        + ("flsuite / Flower |" if "Flower" in names else "")
    )
    print(header + "\n|" + "---|" * (header.count("|") - 1))
    for i, row in enumerate(rows, 1):
        ratios = f"{row['flsuite'] / row['closed form']:.2f} | " + (
            f"{row['flsuite'] / row['Flower']:.2f} |" if "Flower" in row else ""
        )
        print(f"| {i} | " + " | ".join(f"{row[n]:.3f}" for n in names) + " | " + ratios)
    if args.quickstart_baseline:
        walls = quickstart_walls(args.quickstart_baseline, args.reps * 2)
        ours, theirs = statistics.median(w[0] for w in walls), statistics.median(w[1] for w in walls)
        print(
            f"\nquickstart wall, median of {len(walls)}: this tree {ours:.1f} s, baseline {theirs:.1f} s: "
            f"{ours / theirs:.3f}x"
        )


if __name__ == "__main__":
    main()
