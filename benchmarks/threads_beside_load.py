"""The thread policy beside other work (issue 32): seconds per round alone and beside a CPU-bound process, old policy
against new, for the quickstart and an image-model config.

  old   the policy before issue 32: an image model got this process's share of the cores (here: all of them),
        emulated with FLSUITE_THREADS=<cores>;
  new   what the config and `ThreadPolicy` decide now (the quickstart pins 1 thread; "auto" gives one thread per
        `FLOPS_PER_THREAD` of a batch's forward pass, at most the cores).
  alone     nothing else started by the benchmark;
  beside    while one CPU-bound process (a Python busy loop, like any single-threaded job a user runs) shares the cores.

Each measurement is one `flsuite fit` in a fresh process; its number is the median `time/round_s` over the rounds
after the first (imports, allocator and first-Trainer costs excluded). Runs are alternated (every policy and
condition once per repetition), and the table reports the median over repetitions; only ratios measured in the same
run mean anything on a shared machine.

Part 2 (`--steps`), where a second thread pays: one training step (SGD, cross-entropy) of models from a head to a
ResNet, at 1 and 2 threads, alone and beside the same CPU-bound process, each in a fresh process (median ms per step
over 3 s after a warm-up), with the forward GFLOP per step the policy decides by (`flsuite.runtime.step_flops`).

    python benchmarks/threads_beside_load.py [--reps 3] [--rounds 4] [--out docs/results/threads_beside_load.md]
    python benchmarks/threads_beside_load.py --steps [--reps 3]
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

ROOT = Path(__file__).resolve().parents[1]

#: name -> (config arguments, what it is). The image model: FKPL's ResNet-10 expert at 32 px, batch 64, as FedAvg on
#: Office-Caltech-10 (capped so a round takes seconds): about 32 GFLOP per step, so "auto" gives it two threads.
CONFIGS = {
    "quickstart": (["--config", "configs/quickstart.yaml"], "SmallCNN on 8x8 digits, batch 16, 8 clients"),
    "resnet10-office": (
        [
            "--config",
            "configs/fkpl/office_caltech10_resnet10.yaml",
            "--method",
            "flsuite.methods.fedavg.FedAvg",
            "--local.accelerator",
            "cpu",
            "--local.loop",
            "lean",
            "--local.steps",
            "2",
            "--sampling.per_round",
            "2",
            "--data.init_args.max_train_per_domain",
            "160",
            "--data.init_args.max_test_per_domain",
            "32",
            "--eval_every",
            "1",
            "--last_k",
            "1",
        ],
        "ResNet-10 at 32 px, batch 64, 2 clients x 2 steps per round",
    ),
}


def hog() -> subprocess.Popen:
    """One CPU-bound process, until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run(config: list[str], rounds: int, threads: int | None) -> tuple[float, dict]:
    """One `flsuite fit`: the median seconds per round after the first, and the thread decision it recorded."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLSUITE_THREADS", "FLSUITE_PARALLEL", "OMP_NUM_THREADS")}
    if threads is not None:
        env["FLSUITE_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "flsuite.cli",
            "fit",
            *config,
            "--rounds",
            str(rounds),
            "--progress",
            "false",
            "--wandb.enabled",
            "false",
            "--run_dir",
            tmp + "/run",
        ]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        rounds_s = [
            json.loads(line)["time/round_s"] for line in Path(tmp, "run", "timings.jsonl").read_text().splitlines()
        ]
        decision = json.loads(Path(tmp, "run", "environment.json").read_text())["threads"]
    return statistics.median(rounds_s[1:]), decision


#: Part 2's models: name -> (ModelSpec class path and arguments, input shape, batch size).
STEP_MODELS = {
    "MLP on 512-d embeddings, batch 64": ("flsuite.models.heads.MLP", {}, (512,), 64),
    "quickstart SmallCNN 8x8, batch 16": (
        "flsuite.models.heads.SmallCNN",
        {"channels": [16, 32], "hidden": 64},
        (1, 8, 8),
        16,
    ),
    "SmallCNN 28x28, batch 32": ("flsuite.models.heads.SmallCNN", {}, (1, 28, 28), 32),
    "SmallCNN 28x28, batch 256": ("flsuite.models.heads.SmallCNN", {}, (1, 28, 28), 256),
    "ResNet-18 32 px (7x7 stem), batch 64": ("flsuite.models.backbones.ResNet18", {}, (3, 32, 32), 64),
    "ResNet-10 32 px, batch 16": ("flsuite.models.backbones.ResNet10", {}, (3, 32, 32), 16),
    "ResNet-10 32 px, batch 64": ("flsuite.models.backbones.ResNet10", {}, (3, 32, 32), 64),
}


def one_step_timing(name: str, threads: int) -> None:
    """Child process: median milliseconds of one training step of `STEP_MODELS[name]` at `threads` threads."""
    import importlib

    import torch

    from flsuite.runtime import step_flops

    torch.set_num_threads(threads)
    path, kwargs, shape, batch = STEP_MODELS[name]
    module, cls = path.rsplit(".", 1)
    model = getattr(importlib.import_module(module), cls)(**kwargs).build(shape, 10)
    flops = step_flops(model, shape, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))

    def step() -> float:
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return time.perf_counter() - start

    for _ in range(3):
        step()
    times, begin = [], time.perf_counter()
    while time.perf_counter() - begin < 3 or len(times) < 3:
        times.append(step())
    print(json.dumps({"ms": 1000 * statistics.median(times), "gflop": flops / 1e9}))


def steps_table(reps: int) -> str:
    """Part 2: ms per step at 1 and 2 threads, alone and beside the CPU-bound process, alternated."""
    ms: dict[tuple[str, int, str], list[float]] = {}
    gflop: dict[str, float] = {}
    for rep in range(reps):
        for name in STEP_MODELS:
            for condition in ("alone", "beside"):
                for threads in (1, 2):
                    competitor = hog() if condition == "beside" else None
                    try:
                        time.sleep(0.5 if competitor else 0)
                        out = subprocess.run(
                            [sys.executable, __file__, "--one_step", name, str(threads)],
                            cwd=ROOT,
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                    finally:
                        if competitor:
                            competitor.kill()
                            competitor.wait()
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    ms.setdefault((name, threads, condition), []).append(result["ms"])
                    gflop[name] = result["gflop"]
                    print(
                        f"rep {rep} {name:40s} {threads} threads {condition:6s} {result['ms']:8.2f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
    med = {k: statistics.median(v) for k, v in ms.items()}
    lines = [
        (
            f"Milliseconds per training step (median of {reps} alternated runs; "
            f"`python benchmarks/threads_beside_load.py --steps --reps {reps}`):"
        ),
        "",
        (
            "| model, batch | forward GFLOP per step | 1 thread alone | 2 threads alone | 1 / 2 threads alone "
            "| 1 thread beside | 2 threads beside | beside / alone, 1 thread | beside / alone, 2 threads |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in STEP_MODELS:
        a1, a2, b1, b2 = (
            med[(name, 1, "alone")],
            med[(name, 2, "alone")],
            med[(name, 1, "beside")],
            med[(name, 2, "beside")],
        )
        lines.append(
            f"| {name} | {gflop[name]:.3g} | {a1:.2f} | {a2:.2f} | {a1 / a2:.2f} "
            f"| {b1:.2f} | {b2:.2f} | {b1 / a1:.2f} | {b2 / a2:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one_step":
        return one_step_timing(sys.argv[2], int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", action="store_true", help="part 2: one training step per model at 1 and 2 threads")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (Markdown)")
    args = parser.parse_args()
    if args.steps:
        table = steps_table(args.reps)
        print(table)
        if args.out:
            args.out.write_text(table + "\n")
        return
    cores = len(os.sched_getaffinity(0))
    policies = {"old": cores, "new": None}
    times: dict[tuple[str, str, str], list[float]] = {}
    decisions: dict[tuple[str, str], dict] = {}
    for rep in range(args.reps):
        for name in args.configs:
            for condition in ("alone", "beside"):
                for policy, threads in policies.items():
                    competitor = hog() if condition == "beside" else None
                    try:
                        time.sleep(0.5 if competitor else 0)
                        seconds, decision = run(CONFIGS[name][0], args.rounds, threads)
                    finally:
                        if competitor:
                            competitor.kill()
                            competitor.wait()
                    times.setdefault((name, policy, condition), []).append(seconds)
                    decisions[(name, policy)] = decision
                    print(
                        f"rep {rep} {name:16s} {policy} {condition:6s} {seconds:7.3f} s/round "
                        f"({decision['intra_op']} threads)",
                        file=sys.stderr,
                        flush=True,
                    )
    lines = [
        (
            f"Seconds per round (median of {args.reps} alternated runs, each the median over rounds 2-{args.rounds}), "
            f"{cores} cores, alone and beside one CPU-bound process (`python benchmarks/threads_beside_load.py"
            f" --reps {args.reps} --rounds {args.rounds}`):"
        ),
        "",
        "| config | policy | threads | alone | beside | beside / alone |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.configs:
        for policy in policies:
            alone, beside = (statistics.median(times[(name, policy, c)]) for c in ("alone", "beside"))
            d = decisions[(name, policy)]
            lines.append(
                f"| {name} ({CONFIGS[name][1]}) | {policy} | {d['intra_op']} ({d['source']}) | "
                f"{alone:.3f} | {beside:.3f} | {beside / alone:.2f} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
