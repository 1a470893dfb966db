"""Where a study's wall time goes: imports, run set-up, data and feature cache, setup stages, client fits and queries,
server fits and steps, evaluation, checkpoints, run folder and tracking (W&B off, as studies run), the rest.

    python benchmarks/study_profile.py fedegg [--rounds 60] [--variants FedAvg "FedAvg + LH"] [--seed 0]
    python benchmarks/study_profile.py fkpl [--rounds 20] [--epochs 5] [--variants FedAvg FKPL] [--seed 0]

`fedegg`: experiments/fedegg_study.py's runs on the CPU setting's Dir(0.1) (`fedegg_study.run`, its data built once
and handed to the runs in memory, as the study does), into a temporary folder. `fkpl`: a reduced FKPL PACS study
(configs/fkpl/pacs_effnet.yaml; experiments/fkpl_reduced.sh's 20 rounds x 5 local epochs by default) as
experiments/study.py runs it in one warm worker: `flsuite features` once for the seed, then `flsuite fit` per variant
(FedAvg: configs/fkpl/peers/fedavg.yaml; FKPL: the base). Everything runs in this process, after the imports are
timed, with one torch thread (the studies' policy on 2 cores).

Timing: wrappers around the functions that do each phase's work (listed in `PHASES`); time is charged to the
innermost phase running (an evaluation inside a server step counts as evaluation), so the phases add up to the wall
time, the rest being "other" (the round loop itself, aggregation, the method's server update, sampling). Prints a
Markdown table per run and for the whole study, and the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: phase -> (module, attribute path) of the functions whose time is the phase's; "<subclasses of X.m>" wraps the
#: method `m` wherever a subclass of X defines it.
PHASES: dict[str, list[str]] = {
    "run set-up (parser, config, objects)": [
        "flsuite.cli_parsers:fit_parser",  # as main_parser calls it
        "flsuite.cli:fit_parser",  # the names flsuite.cli's functions call
        "flsuite.cli:main_parser",
        "flsuite.cli:build_federation",
        "flsuite.fit_data:build_federation",
    ],
    "data and feature cache": [
        "<subclasses of flsuite.data.base:DataSource.build>",
        "flsuite.data.feature_cache:extract_features",
        "flsuite.cli:run_features",
        "flsuite.data.cache_index:lookup",
    ],
    "setup stages": ["flsuite.federation.run:Federation._setup"],
    "client fits": ["<subclasses of flsuite.federation.executors:Executor.run>"],
    "client queries": ["<subclasses of flsuite.federation.executors:Executor.query>"],
    "server fits": [  # `train` without a Trainer on the CPU (run_fit), `fit` through Lightning
        # the engine's ServerContext; wrapping the protocol's own methods (flsuite.federation.server_context) times
        # nothing: they are stubs no call reaches
        "flsuite.federation.server:RoundServer.train",
        "flsuite.federation.server:RoundServer.fit",
    ],
    "server steps (other)": ["<subclasses of flsuite.federation.server:ServerStep.step>"],
    "evaluation": ["flsuite.federation.phases:evaluate_federation", "flsuite.metrics:evaluate_federation"],
    "checkpoints": ["flsuite.federation.context:RunContext.checkpoint"],
    "run folder and tracking": [
        "flsuite.tracking:Tracker.__init__",
        "flsuite.tracking:Tracker.log_partition",
        "flsuite.tracking:Tracker.log_setup",
        "flsuite.tracking:Tracker.log_round",
        "flsuite.tracking:Tracker.finish",
        "flsuite.tracking:Tracker.close",
        "flsuite.federation.run:environment_info",
        "flsuite.federation.run:create_run_dir",
    ],
}


class PhaseClock:
    """Exclusive time per phase: a wrapped call charges the time since the last event to the phase on top."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[str] = ["other"]
        self.last = time.perf_counter()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.last
        self.last = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._tick()
        self.stack.append(name)
        try:
            yield
        finally:
            self._tick()
            self.stack.pop()

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)

        timed.__wrapped_phase__ = name  # type: ignore[attr-defined]
        return timed

    def take(self) -> dict[str, float]:
        """The seconds per phase since the last take (and reset)."""
        self._tick()
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return list(dict.fromkeys(out))


def install(clock: PhaseClock) -> None:
    """Wrap every function of `PHASES` (modules imported; a target that does not exist is skipped)."""
    for name, targets in PHASES.items():
        for target in targets:
            if target.startswith("<subclasses of "):
                module, rest = target.removeprefix("<subclasses of ").rstrip(">").split(":")
                cls_name, method = rest.split(".")
                base = getattr(importlib.import_module(module), cls_name)
                for cls in _subclasses(base):
                    if method in vars(cls) and not hasattr(vars(cls)[method], "__wrapped_phase__"):
                        setattr(cls, method, clock.wrap(vars(cls)[method], name))
                continue
            module, path = target.split(":")
            owner: Any = importlib.import_module(module)
            *parents, attr = path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            fn = getattr(owner, attr, None)
            if fn is not None and not hasattr(fn, "__wrapped_phase__"):
                setattr(owner, attr, clock.wrap(fn, name))


def table(title: str, seconds: dict[str, float]) -> str:
    wall = sum(seconds.values())
    order = ["imports (torch, flsuite; fresh process)", *PHASES, "other"]
    rows = [f"| {p} | {seconds[p]:.1f} | {100 * seconds[p] / wall:.1f} % |" for p in order if seconds.get(p, 0) > 0.05]
    return "\n".join([f"**{title}** (wall {wall:.1f} s)", "", "| phase | s | share |", "|---|---|---|", *rows, ""])


def fedegg_runs(args: argparse.Namespace, out: Path, clock: PhaseClock) -> list[tuple[str, dict[str, float]]]:
    sys.path.insert(0, str(ROOT / "experiments"))
    import fedegg_study as fedegg

    fedegg.RUNS = out
    if args.rounds is not None:
        (out / "rounds.yaml").write_text(f"rounds: {args.rounds}\n")
        fedegg.SETTINGS["dir0.1"] = [*fedegg.SETTINGS["dir0.1"], str(out / "rounds.yaml")]
    install(clock)  # fedegg_study imported the command line's functions by name: wrap its copies too
    fedegg.build_federation = clock.wrap(fedegg.build_federation, "run set-up (parser, config, objects)")
    fedegg.fit_parser = clock.wrap(fedegg.fit_parser, "run set-up (parser, config, objects)")
    fedegg.prewarm = clock.wrap(fedegg.prewarm, "data and feature cache")
    results = []
    for variant in args.variants or ["FedAvg", "FedAvg + LH"]:
        overlay = [] if variant == "FedAvg" else [fedegg.LEVELS[variant.split("+")[1].strip()]]
        fedegg.run("profile", "dir0.1", variant, overlay, args.seed)
        results.append((variant, clock.take()))
    return results


def fkpl_runs(args: argparse.Namespace, out: Path, clock: PhaseClock) -> list[tuple[str, dict[str, float]]]:
    from flsuite.cli import main

    install(clock)
    base = ROOT / "configs" / "fkpl" / "pacs_effnet.yaml"
    extra = [
        "--rounds",
        str(args.rounds or 20),
        "--local.epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
        "--progress",
        "false",
        "--wandb.enabled",
        "false",
    ]
    results = []
    if main(["features", "--config", str(base), "--seed", str(args.seed)]) != 0:
        sys.exit("flsuite features failed")
    results.append(("flsuite features (the study's once-per-seed step)", clock.take()))
    overlays = {"FedAvg": [str(ROOT / "configs" / "fkpl" / "peers" / "fedavg.yaml")], "FKPL": []}
    for variant in args.variants or ["FedAvg", "FKPL"]:
        configs = [a for c in [str(base), *overlays[variant]] for a in ("--config", c)]
        if main(["fit", *configs, "--run_dir", str(out / variant), *extra]) != 0:
            sys.exit(f"flsuite fit ({variant}) failed")
        results.append((variant, clock.take()))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=["fedegg", "fkpl"])
    ap.add_argument("--rounds", type=int, help="rounds per run (default: the study's own: fedegg 60, fkpl 20)")
    ap.add_argument("--epochs", type=int, default=5, help="fkpl: local epochs (the reduced study's 5)")
    ap.add_argument("--variants", nargs="+", help="fedegg: FedAvg, 'FedAvg + LH|MH|HH'; fkpl: FedAvg, FKPL")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("FLSUITE_THREADS", "1")
    load = os.getloadavg()
    start = time.perf_counter()
    from flsuite.cli_parsers import fit_parser

    fit_parser()
    imports = time.perf_counter() - start
    clock = PhaseClock()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory(prefix=f"profile-{args.study}-") as tmp:
        runs = (fedegg_runs if args.study == "fedegg" else fkpl_runs)(args, Path(tmp), clock)
    total: dict[str, float] = defaultdict(float, {"imports (torch, flsuite; fresh process)": imports})
    for _, seconds in runs:
        for k, v in seconds.items():
            total[k] += v
    print(
        f"load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load)}; "
        f"after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    )
    print(f"`{' '.join(['python', 'benchmarks/study_profile.py', *sys.argv[1:]])}`\n")
    for name, seconds in runs:
        print(table(name, seconds))
    print(table(f"{args.study} study, one seed, in one process", total))


if __name__ == "__main__":
    main()
