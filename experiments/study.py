"""Run a study (config variants × seeds) with `flsuite fit` and write its results table.

    python experiments/study.py --name ggeur_digits_offline \
        --base configs/ggeur/effnet/digits_offline.yaml \
        --variant "FedAvg=" \
        --variant "+ GGEUR (Step 1)=configs/ggeur/with_ggeur_step1.yaml" \
        --variant "+ GGEUR (Step 1 & 2)=configs/ggeur/with_ggeur.yaml" \
        --seeds 0 1 2 --workers 2 --out docs/results/ggeur_digits_offline.md

A variant may stack overlays, e.g. "SCAFFOLD + GGEUR=configs/baselines/scaffold.yaml,configs/ggeur/with_ggeur.yaml".
Each run goes to `runs/<name>/<variant>/seed<k>`. A folder that already holds a run is used only when it is the same
experiment (`flsuite.provenance.same_experiment`): its config.yaml equals the run's resolved config (but where it is
written and logged) and its environment.json records the code this study runs (package version, git commit, and
identical uncommitted changes, if any). Then a finished run is reused and a killed one continued (`--resume`), so a
killed study continues where it stopped; otherwise the old folder is moved to `runs/<name>/<variant>/.replaced/` and the
run starts afresh, and the reason is printed (the keys that differ, or the two code versions). Features are extracted
first, one seed at a time (`flsuite features`), so parallel workers only read the cache. Workers run with one torch
thread each. The runs run in `--workers` warm processes (`flsuite.pool.WarmPool`: each imports torch and
flsuite once, at the first run it takes, and then runs up to `--runs_per_worker` runs, each as `flsuite fit` would in a
fresh process: its own environment, log, seed streams, thread policy, run folder and W&B run); a run whose worker dies
fails alone (exit 137, the worker replaced). `--fresh_processes` runs every run as a `flsuite fit` process of its own
instead (as before the pool). The table is `flsuite compare`'s (flsuite/compare/) with the variants as labels: per
variant, each domain's last-k-round accuracy, AVG, STD (population and sample, across domains of the last-k means),
rounds to target, bytes and seconds per round, as mean ± std over seeds. Extra `flsuite fit` flags for every run can
follow `--`; a study whose finished runs were given other flags (read from each run's environment.json) stops before
running anything, since its table would mix settings (e.g. 50 and 100 rounds). A variant's list may also hold
`--key=value` flags for that variant alone, in order with its overlays, so a grid needs no overlay files: "FedProx [mu
0.1]=configs/baselines/fedprox.yaml,--method.init_args.mu=0.1".

Training noise on fixed clients (issue 38): `--train_seeds T1 T2 ...` runs every `--seeds` value as a data seed with
each training seed (`--seed S --train_seed T`, README "Two seeds"), into `runs/<name>/<variant>/seed<S>-train<T>`; the
table then averages over the (data seed × training seed) grid and pairs runs by both seeds.

Selection on validation data (`--select_on val`, the suite's tuning policy, docs/results.md "Tuning policy"): the
variants form method groups, a group being the variants whose labels agree up to " [" ("FedProx [mu 0.01]" and
"FedProx [mu 0.1]" are the grid of "FedProx"; a label without " [" is a group of its own). Every variant runs on
every seed as usual; then each group keeps the one variant with the best validation last-k AVG (`last{k}/val/acc_mean`
of summary.json, the mean over its finished seeds; a tie goes to the variant given first), and the table shows the
test numbers of the kept variants only, followed by each group's grid (the config keys its variants differ in, and
every variant's validation AVG) and its choice. The test set never takes part in the choice. The runs need a
validation split (`validation.fraction` > 0 in the base, an overlay or the flags after `--`): without one the study
stops before running anything. `--select_seeds 0` runs the grid on seed 0 only and chooses there; the chosen variants
then also run on the other `--seeds`, and the test table is theirs over all seeds (the grid table: over seed 0).

`--wandb_report` (the extra `pip install "flsuite[dashboard]"`) publishes the table and the convergence plot as a W&B
report over the study's runs (`flsuite compare --wandb-report`); its runs then log to W&B under the group `--name`
(offline into their folders: `wandb sync` uploads them), and with W&B offline the report's spec is written next to
`--out` (`<out>.wandb_report.json`).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import yaml

from flsuite import compare
from flsuite.pool import KILLED, WarmPool
from flsuite.records import VAL_PREFIX


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "base"


def config_args(base: Path, overlay: str) -> list[str]:
    """A variant's config files and flags, as `flsuite fit` arguments."""
    args = ["--config", str(base)]
    for item in filter(None, overlay.split(",")):
        args += [item] if item.startswith("--") else ["--config", item]
    return args


class RunSeed(NamedTuple):
    """A run's seeds in a study: `--seed data`, and `--train_seed train` unless None; shown (and named in the run's
    folder, `seed<it>`) as `<data>` or `<data>-train<train>`."""

    data: int
    train: int | None = None

    def __str__(self) -> str:
        return str(self.data) if self.train is None else f"{self.data}-train{self.train}"


def run_seeds(seeds: list[int], train_seeds: list[int] | None) -> list[RunSeed]:
    """The study's runs per variant: each data seed alone, or with each of `train_seeds` (the grid)."""
    return [RunSeed(s, t) for s in seeds for t in (train_seeds or [None])]


def common_args(seed: int | RunSeed, extra: list[str], wandb_group: str | None = None) -> list[str]:
    """The `flsuite fit` arguments every run of the study gets; with `wandb_group` it logs to W&B under that group."""
    wandb = ["--name", wandb_group, "--wandb.enabled", "true"] if wandb_group else ["--wandb.enabled", "false"]
    seed = seed if isinstance(seed, RunSeed) else RunSeed(seed)
    seeds = ["--seed", str(seed.data), *(["--train_seed", str(seed.train)] if seed.train is not None else [])]
    return [*seeds, "--progress", "false", *wandb, *extra]


def fit_command(
    base: Path, overlay: str, seed: int, run_dir: Path, extra: list[str], wandb_group: str | None = None
) -> list[str]:
    """The run's `flsuite fit` command; with `wandb_group` the run logs to W&B under that group (for a report)."""
    cmd = [sys.executable, "-m", "flsuite.cli", "fit", *config_args(base, overlay)]
    common = common_args(seed, extra, wandb_group)
    if (
        run_dir / "checkpoints" / "last.pt"
    ).is_file():  # killed mid-run: continue it (flsuite refuses to reuse the folder)
        return cmd + ["--resume", str(run_dir), *common]
    if run_dir.exists():  # started but never checkpointed: nothing to keep
        shutil.rmtree(run_dir)
    return cmd + ["--run_dir", str(run_dir), *common]


@functools.cache
def _fit_parser():
    from flsuite.cli_parsers import fit_parser

    return fit_parser()


def requested_config(
    base: Path, overlay: str, seed: int, run_dir: Path, extra: list[str], wandb_group: str | None = None
) -> str:
    """The resolved config (YAML) the run's `flsuite fit` command would write into its config.yaml."""
    from flsuite.cli import resolved_config_yaml

    parser = _fit_parser()
    argv = [*config_args(base, overlay), "--run_dir", str(run_dir), *common_args(seed, extra, wandb_group)]
    try:
        return resolved_config_yaml(parser, parser.parse_args(argv))
    except Exception as err:  # noqa: BLE001 - the run would fail the same way: say so before running anything
        sys.exit(f"flsuite fit {shlex.join(argv)}: {' '.join(str(err).split())}")


def needs_run(
    run_dir: Path, base: Path, overlay: str, seed: int, extra: list[str], wandb_group: str | None = None
) -> bool:
    """Whether the run must run (or continue). A folder holding a run of the same experiment (config and code,
    `flsuite.provenance.same_experiment`) is reused when finished (False) and continued when killed (True:
    `fit_command` resumes it); a folder holding any other run is moved to `.replaced/` beside it, with the reason
    printed, and the run starts afresh (True)."""
    from flsuite.provenance import move_aside, same_experiment
    from flsuite.runfolder import holds_run

    if not holds_run(run_dir):
        return True
    decision = same_experiment(run_dir, requested_config(base, overlay, seed, run_dir, extra, wandb_group))
    if decision.same:
        return not (run_dir / "summary.json").is_file()
    print(
        f"{run_dir}: not reused, runs again ({decision.reason}); the old run is now {move_aside(run_dir)}", flush=True
    )
    return True


def fit_flags_of(run_dir: Path) -> list[str] | None:
    """The extra `flsuite fit` flags a study gave this run: what follows study.py's own `--wandb.enabled false` in
    the argv its environment.json recorded (None when it cannot tell)."""
    try:
        argv = json.loads((run_dir / "environment.json").read_text())["argv"]
        return argv[argv.index("--wandb.enabled") + 2 :]
    except (OSError, KeyError, ValueError, json.JSONDecodeError):
        return None


def check_same_flags(runs: Path, extra: list[str]) -> None:
    """Stop when a finished run of this study folder was given other extra flags than this invocation passes."""
    for summary in sorted(runs.glob("*/seed*/summary.json")):
        flags = fit_flags_of(summary.parent)
        if flags is not None and flags != extra:
            sys.exit(
                f"{summary.parent} was run with the extra flsuite fit flags {shlex.join(flags) or '(none)'}, but this "
                f"invocation passes {shlex.join(extra) or '(none)'}: the table would mix settings. Pass the same flags "
                f"after --, or give the study another --name."
            )


def run_env(parallel: int = 1) -> dict[str, str]:
    """A run's environment: this process's, with `parallel` (how many runs run side by side) as FLSUITE_PARALLEL, so
    the thread policy (flsuite.runtime.ThreadPolicy) gives each its share of the cores instead of every run spinning
    threads on all of them. An OMP_NUM_THREADS or FLSUITE_THREADS of the caller passes through unchanged."""
    return {**os.environ, "FLSUITE_PARALLEL": str(parallel), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}


def run(cmd: list[str], log: Path, parallel: int = 1, pool: WarmPool | None = None) -> int:
    """Run `cmd` with its output in `log` and the environment `run_env(parallel)`: a process of its own, or with `pool`
    (`cmd` a `fit_command`) in one of its warm workers, as `flsuite fit` with the same arguments."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if pool is not None and cmd[1:4] == ["-m", "flsuite.cli", "fit"]:
        code = pool.run(cmd[4:], str(log), run_env(parallel))
        if code == KILLED:
            with open(log, "a") as f:
                f.write(
                    f"\nstudy.py: the worker running this run died (killed, out of memory or a crash); exit {KILLED}\n"
                )
        return code
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=run_env(parallel)).returncode


def comparison(variants: list[tuple[str, str]], seeds: list[int], runs: Path) -> compare.Comparison:
    """The study's finished runs, labelled by variant, compared by `flsuite.compare`."""
    groups = {
        label: [d for s in seeds if ((d := runs / slug(label) / f"seed{s}") / "summary.json").is_file()]
        for label, _ in variants
    }
    return compare.compare(groups)


def method_group(label: str) -> str:
    """A variant's method group: its label up to " [" ("FedProx [mu 0.01]" -> "FedProx"), else the whole label."""
    return label.split(" [", 1)[0].strip()


def validation_fraction(base: Path, overlay: str, extra: list[str]) -> float:
    """The `validation.fraction` a variant's runs get: the last of its config files and flags (base, the variant's
    list, the flags after `--`, in the order `flsuite fit` reads them) that sets it; 0 when none does."""
    items, fraction = [str(base), *filter(None, overlay.split(",")), *extra], 0.0
    for i, item in enumerate(items):
        if item == "--validation.fraction" and i + 1 < len(items):
            fraction = float(items[i + 1])
        elif item.startswith("--validation.fraction="):
            fraction = float(item.split("=", 1)[1])
        elif item.endswith((".yaml", ".yml")) and Path(item).is_file():
            fraction = float(
                ((yaml.safe_load(Path(item).read_text()) or {}).get("validation") or {}).get("fraction", fraction)
            )
    return fraction


def select(variants: list[tuple[str, str]], seeds: list[int], runs: Path) -> tuple[list[tuple[str, str]], str]:
    """Per method group, the variant with the best mean validation last-k AVG over its finished seeds (first given on
    a tie), and the Markdown stating every group's grid, its variants' validation AVG and the choice."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for label, overlay in variants:
        groups.setdefault(method_group(label), []).append((label, overlay))
    chosen, rows = [], []
    for group, members in groups.items():
        scores, configs = {}, {}
        for label, _ in members:
            done = [
                compare.load_run(d)
                for s in seeds
                if ((d := runs / slug(label) / f"seed{s}") / "summary.json").is_file()
            ]
            if not done:
                continue
            key = done[0].prefix + VAL_PREFIX + "acc_mean"
            if missing := [str(r.path) for r in done if key not in r.summary]:
                sys.exit(
                    f"--select_on val: {', '.join(missing)} has no {key} in summary.json "
                    "(run without a validation split)"
                )
            scores[label], configs[label] = [float(r.summary[key]) for r in done], compare.experiment(done[0].config)
        if not scores:
            continue
        best = max(scores, key=lambda label: float(np.mean(scores[label])))  # max keeps the first of equal scores
        chosen += [m for m in members if m[0] == best]
        keys = compare.differing_keys(list(configs.values()))
        grid = (
            "; ".join(
                f"`{k}` ∈ {{{', '.join(dict.fromkeys(str(c.get(k, '—')) for c in configs.values()))}}}" for k in keys
            )
            or "—"
        )
        values = ", ".join(f"`{k}={configs[best].get(k, '—')}`" for k in keys) or "—"
        shown = "; ".join(
            f"{'**' * (lb == best)}{lb}: {compare.mean_pm(v)}{'**' * (lb == best)}" for lb, v in scores.items()
        )
        rows.append(f"| {group} | {grid} | {shown} | {best} | {values} |")
    head = [
        (
            "Chosen on validation data (`--select_on val`): per method, "
            "the grid variant with the best validation last-k AVG"
        ),
        "(mean ± std over seeds); the table above reports the test numbers of the chosen variants only.",
        "",
        "| method | grid | validation AVG per variant | chosen | chosen values |",
        "|---|---|---|---|---|",
    ]
    return chosen, "\n".join([*head, *rows, ""])


def table(
    name: str,
    variants: list[tuple[str, str]],
    seeds: list[int],
    runs: Path,
    command: str,
    select_on: str | None = None,
    select_seeds: list[int] | None = None,
) -> str:
    selection = ""
    if select_on == "val":
        variants, selection = select(variants, select_seeds or seeds, runs)
    text = comparison(variants, seeds, runs).markdown(name)
    return "\n".join([text, *([selection] if selection else []), "Regenerate with:", "", "```bash", command, "```", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument(
        "--variant", action="append", required=True, help='"Label=overlay.yaml[,more.yaml]" (empty = the base alone)'
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--train_seeds", type=int, nargs="+", help="training seeds run on each of --seeds as data seed (see above)"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--runs_per_worker",
        type=int,
        default=50,
        help="runs a warm worker process runs before it is replaced (see above)",
    )
    ap.add_argument(
        "--fresh_processes",
        action="store_true",
        help="run every run as a flsuite fit process of its own (no warm workers)",
    )
    ap.add_argument("--runs", type=Path, default=Path("runs"))
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--html", type=Path, help="also write a self-contained HTML page (tables and convergence curves) here"
    )
    ap.add_argument("--command", help="the regenerating command printed under the table (default: this invocation)")
    ap.add_argument(
        "--select_on",
        choices=["val"],
        help="per method group, keep the variant with the best validation AVG (see above)",
    )
    ap.add_argument(
        "--select_seeds",
        type=int,
        nargs="+",
        help="with --select_on: the seeds every grid variant runs on and is chosen on (default: --seeds)",
    )
    ap.add_argument(
        "--wandb_report",
        action="store_true",
        help="publish the table as a W&B report (offline: its spec next to --out; see above)",
    )
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="flags passed to every flsuite fit after --")
    args = ap.parse_args()
    extra = [a for a in args.extra if a != "--"]
    if bad := [s for s in [*args.seeds, *(args.train_seeds or [])] if not 0 <= s < 2**32]:
        sys.exit(f"--seeds and --train_seeds must be integers in [0, 2**32) (flsuite.seeding), got {bad}")
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    runs = args.runs / args.name
    if args.wandb_report:
        from flsuite.dashboard.spec import require_library

        require_library()  # before any run
    check_same_flags(runs, extra)
    if args.select_on and (
        none := [label for label, overlay in variants if not validation_fraction(args.base, overlay, extra) > 0]
    ):
        sys.exit(
            f"--select_on val needs a validation split, but variant(s) {none} run with validation.fraction 0: "
            "set it (e.g. -- --validation.fraction 0.1)"
        )

    if args.workers < 1 or args.runs_per_worker < 1:
        sys.exit(f"--workers and --runs_per_worker must be >= 1, got {args.workers} and {args.runs_per_worker}")
    # The warm workers start with the first runs (none when every run is reused).
    warm = None if args.fresh_processes else WarmPool(args.workers, args.runs_per_worker)
    for seed in args.seeds:  # fill the feature cache once per seed before parallel runs
        cmd = [sys.executable, "-m", "flsuite.cli", "features", "--config", str(args.base), "--seed", str(seed), *extra]
        if run(cmd, runs / f"features-seed{seed}.log") != 0:
            if warm is not None:
                warm.close()
            sys.exit(f"feature extraction failed: see {runs / f'features-seed{seed}.log'}")

    select_seeds = args.select_seeds or args.seeds
    if args.select_seeds and (not args.select_on or not set(args.select_seeds) <= set(args.seeds)):
        sys.exit(f"--select_seeds {args.select_seeds} needs --select_on and must be among --seeds {args.seeds}")
    grid_seeds = select_seeds if args.select_on else args.seeds
    # From here a seed is a run's (data seed, training seed): the grid with --train_seeds.
    args.seeds, select_seeds, grid_seeds = (
        run_seeds(s, args.train_seeds) for s in (args.seeds, select_seeds, grid_seeds)
    )

    group = args.name if args.wandb_report else None

    def pending(items: list[tuple[str, str]], seeds: list[int]) -> list[tuple[str, str, int]]:
        """The runs to run (or continue); finished runs of the same experiment are reused, others moved aside."""
        todo = [
            (label, overlay, seed)
            for seed in seeds
            for label, overlay in items
            if needs_run(runs / slug(label) / f"seed{seed}", args.base, overlay, seed, extra, group)
        ]
        if reused := len(items) * len(seeds) - len(todo):
            from flsuite.provenance import code_label, code_version

            print(f"reusing {reused} finished run(s): same config and code ({code_label(code_version())})", flush=True)
        return todo

    jobs = pending(variants, grid_seeds)

    def job(item: tuple[str, str, int]) -> tuple[str, int, int]:
        label, overlay, seed = item
        run_dir = runs / slug(label) / f"seed{seed}"
        if (run_dir / "summary.json").is_file():  # finished meanwhile (e.g. by another study of the same name)
            return label, seed, 0
        code = run(
            fit_command(args.base, overlay, seed, run_dir, extra, group),
            runs / slug(label) / f"seed{seed}.log",
            parallel=args.workers,
            pool=warm,
        )
        print(f"{label} seed {seed}: exit {code}", flush=True)
        return label, seed, code

    try:
        with ThreadPoolExecutor(args.workers) as pool:
            failed = [r for r in pool.map(job, jobs) if r[2] != 0]
            if args.select_on and (
                rest := [s for s in args.seeds if s not in grid_seeds]
            ):  # the chosen variants on the other seeds
                failed += [r for r in pool.map(job, pending(select(variants, grid_seeds, runs)[0], rest)) if r[2] != 0]
    finally:
        if warm is not None:
            warm.close()
    command = args.command or "python experiments/study.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = table(args.name, variants, args.seeds, runs, command, args.select_on, select_seeds)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.html:
        shown = select(variants, select_seeds, runs)[0] if args.select_on else variants
        result, png = comparison(shown, args.seeds, runs), io.BytesIO()
        result.plot(png)
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(result.html(args.name, png.getvalue()))
    if args.wandb_report:
        from flsuite.dashboard.publish import publish

        shown = select(variants, select_seeds, runs)[0] if args.select_on else variants
        spec_file = args.out.with_suffix(".wandb_report.json") if args.out else runs / "wandb_report.json"
        print(f"W&B report: {publish(comparison(shown, args.seeds, runs), args.name, command, spec_file)}")
    if failed:
        sys.exit(f"failed runs: {failed}")


if __name__ == "__main__":
    main()
