"""FedEGG's studies on the CPU setting (configs/fedegg/cpu): Table 2/3 analog, guidance levels, τ sweep, convergence.

    OMP_NUM_THREADS=1 nice -n 10 python experiments/fedegg_study.py --study table --seeds 0
    ... --study levels | --study tau | --study convergence (a PNG from the table study's runs)
    ... --study strength    (issue 23: every method plain and + FedEGG-LH as T_g = 1 (the paper's), 5, 20 and
                             shared_head; paired per seed, with rounds guided and the guiding update's size)
    ... --study strength --part N/M   (only the N-th of M slices of its runs, to run M processes side by side)
    ... --study noise --seeds 0 --train_seeds 0 1 2 3 4   (issue 38: FedAvg, + LH and + LH shared on the data seeds'
                             clients repeated over training seeds; the training noise and paired differences with SE
                             and 95 % intervals; --part N/M as above; --methods FedNova: that method, + LH and
                             + LH shared instead of FedAvg's)

Every run is the configs' run (`flsuite fit --config configs/fedegg/cpu/mnist_dir0.1.yaml [--config <method>]
[--config configs/fedegg/with_fedegg.yaml]`, parsed by the CLI's own parser, its resolved YAML in the run folder),
except that the data is built once per (setting, seed) and each guiding set once, and handed to the runs in memory:
the benchmark embeds per client, and each client's cache read/write touches the whole 60,000-image pool's cache file.
Runs go to runs/fedegg/<study>/<setting>/<variant>/seed<k>. A folder that already holds a run is reused only when it
is the same experiment (`flsuite.provenance.same_experiment`: its config.yaml equals the run's resolved config, but
where it is written and logged, and its environment.json records the code running now: package version, git commit,
identical uncommitted changes if any); otherwise it is moved to `.replaced/` beside it, the reason printed (the keys
that differ, or the two code versions), and the run made again. An unfinished folder is moved aside the same way.
Accuracy = the global model's test accuracy averaged over the last 10 rounds (T/6, the paper's last 50 of 300, A14).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

from flsuite.cli import build_federation, resolved_config_yaml
from flsuite.cli_parsers import fit_parser
from flsuite.data.base import DataSource, FederatedData
from flsuite.federation.server import PublicData
from flsuite.provenance import move_aside, same_experiment
from flsuite.runfolder import holds_run

RUNS = Path("runs/fedegg")
BASE = "configs/fedegg/cpu/mnist_dir0.1.yaml"
SETTINGS = {"dir0.1": [], "dir10": ["configs/fedegg/cpu/dir10.yaml"]}
METHODS = {
    "FedAvg": [],
    "SCAFFOLD": ["configs/baselines/scaffold.yaml"],
    "FedProx": ["configs/baselines/fedprox.yaml"],
    "FedNova": ["configs/baselines/fednova.yaml"],
    "FedDyn": ["configs/baselines/feddyn.yaml"],
    "FedDC": ["configs/baselines/feddc.yaml"],
}
LEVELS = {
    "LH": "configs/fedegg/with_fedegg.yaml",
    "MH": "configs/fedegg/with_fedegg_mh.yaml",
    "HH": "configs/fedegg/with_fedegg_hh.yaml",
}
LAST = 10


class Prebuilt(DataSource):
    """Data built once, handed to several runs (the study's cache)."""

    def __init__(self, data: FederatedData) -> None:
        self.data = data

    def build(self, seed: int) -> FederatedData:
        return self.data


def prewarm(bench, seed: int) -> None:
    """Embed every row a build will ask for in one cache write per pool (the build then reads it per client)."""
    for domain, dd in bench.load_domains(seed).items():
        bench._split(dd.train_pool, dd.train_rows, domain, dd.pools[0])
        bench._split(dd.test_pool, dd.test_rows, domain, dd.pools[1])


_data: dict[tuple[str, int], FederatedData] = {}
_guiding: dict[str, FederatedData] = {}


@functools.cache
def parser():
    return fit_parser()


def requested(
    configs: list[str],
    seed: int,
    run_dir: Path,
    tau: float | None = None,
    step_args: dict | None = None,
    train_seed: int | None = None,
):
    """The run's parsed config (a fixed τ and the variant's FedEGG options set in it) and its resolved YAML; with
    `train_seed`, `seed` is the data seed and the training seed is `train_seed` (flsuite.seeding)."""
    seeds = ["--seed", str(seed)]
    if train_seed is not None:
        seeds += ["--data_seed", str(seed), "--train_seed", str(train_seed)]
    argv = [a for c in configs for a in ("--config", c)] + [
        *seeds,
        "--run_dir",
        str(run_dir),
        "--progress",
        "false",
        "--wandb.enabled",
        "false",
    ]
    cfg = parser().parse_args(argv)
    if tau is not None:  # a fixed τ (the sweep), in the resolved config too
        cfg.server_steps[0].init_args.tau = tau
    for key, value in (step_args or {}).items():  # FedEGG options of a variant, in the resolved config too
        setattr(cfg.server_steps[0].init_args, key, value)
    return cfg, resolved_config_yaml(parser(), cfg)


def federation(cfg, configs: list[str], seed: int, setting: str):
    """The run's federation, its data built once per (setting, data seed) and its guiding set once per level, handed
    over in memory."""
    fed = build_federation(parser(), cfg)
    data_seed = fed.seeds.data  # the clients are the data seed's (flsuite.seeding): training seeds share one build
    if (setting, data_seed) not in _data:
        prewarm(fed.data, data_seed)
        _data[(setting, data_seed)] = fed.data.build(data_seed)
    fed.data = Prebuilt(_data[(setting, data_seed)])
    for step in fed.server_steps:
        key = next((lv for lv, path in LEVELS.items() if path in configs), "")
        if key not in _guiding:
            for source in step.data.source.sources.values():
                prewarm(source, step.data.source.seed)
            _guiding[key] = step.data.source.build(seed)
        step.data = PublicData(Prebuilt(_guiding[key]))
    return fed


def run(
    study: str,
    setting: str,
    label: str,
    configs: list[str],
    seed: int,
    tau: float | None = None,
    step_args: dict | None = None,
    train_seed: int | None = None,
) -> Path:
    """The run's folder, after running it unless it holds a finished run of the same experiment (config and code);
    with `train_seed`, `seed` is the data seed (folder data<seed>_train<train_seed>)."""
    folder = f"seed{seed}" if train_seed is None else f"data{seed}_train{train_seed}"
    run_dir = RUNS / study / setting / label.replace(" ", "").replace("+", "_") / folder
    configs = [BASE, *SETTINGS[setting], *configs]
    cfg, yaml = requested(configs, seed, run_dir, tau, step_args, train_seed)
    if holds_run(run_dir):
        decision = same_experiment(run_dir, yaml)
        if decision.same and (run_dir / "summary.json").is_file():
            return run_dir
        reason = decision.reason if not decision.same else "it is unfinished"
        print(f"{run_dir}: not reused, runs again ({reason}); the old run is now {move_aside(run_dir)}", flush=True)
    t0 = time.time()
    federation(cfg, configs, seed, setting).fit(config_yaml=yaml)
    print(f"{study} {setting} {label} {folder}: {time.time() - t0:.0f}s", flush=True)
    return run_dir


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def last_acc(run_dir: Path) -> float:
    hist = [r for r in records(run_dir) if "acc_mean" in r]
    return sum(r["acc_mean"] for r in hist[-LAST:]) / len(hist[-LAST:])


def mean_std(values: list[float]) -> str:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return f"{m:.2f}" if len(values) == 1 else f"{m:.2f} ± {s:.2f}"


def fedegg_log(run_dir: Path) -> tuple[float, int]:
    return records(run_dir)[0]["server/fedegg/tau"], guided_log(run_dir)[0]


def table(seeds: list[int]) -> str:
    lines = ["| method | Dir(0.1) | + FedEGG-LH | Δ | Dir(10) | + FedEGG-LH | Δ |", "|---|---|---|---|---|---|---|"]
    for name, overlay in METHODS.items():
        row = [name]
        for setting in SETTINGS:
            plain = [last_acc(run("table", setting, name, overlay, s)) for s in seeds]
            guided = [last_acc(run("table", setting, f"{name} + LH", [*overlay, LEVELS["LH"]], s)) for s in seeds]
            delta = [g - p for g, p in zip(guided, plain)]
            row += [mean_std(plain), mean_std(guided), f"{sum(delta) / len(delta):+.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


#: The guiding-strength variants of FedEGG-LH (issue 23): the paper's T_g = 1, more steps per guided round, and the
#: FL head trained on mapped guiding labels (shared_head, spec A1).
STRENGTH = {"LH": {}, "LH T5": {"steps": 5}, "LH T20": {"steps": 20}, "LH shared": {"shared_head": True}}
#: The runs in order (setting, variants): Dir(0.1) (the paper's headline setting) whole, then Dir(10) at the paper's
#: T_g and with the shared head, then Dir(10)'s stronger T_g, so a study cut short still has every seed of a row.
ORDER = [("dir0.1", [None, *STRENGTH]), ("dir10", [None, "LH", "LH shared"]), ("dir10", ["LH T5", "LH T20"])]


def strength_runs(seeds: list[int], methods: list[str] | None = None) -> list[tuple]:
    """Every (setting, method, variant, seed) of the strength study (its `methods` rows), in `ORDER`, seed by seed
    within each part."""
    return [
        (setting, name, variant, seed)
        for setting, variants in ORDER
        for seed in seeds
        for name in methods or METHODS
        for variant in variants
    ]


def strength_run(setting: str, name: str, variant: str | None, seed: int) -> Path:
    overlay = METHODS[name]
    if variant is None:
        return run("strength", setting, name, overlay, seed)
    return run("strength", setting, f"{name} + {variant}", [*overlay, LEVELS["LH"]], seed, step_args=STRENGTH[variant])


def guided_log(run_dir: Path) -> tuple[int, float]:
    """Rounds guided and the mean update_ratio over the guided rounds."""
    hist = [r for r in records(run_dir) if "server/fedegg/gate" in r]
    guided = [r["server/fedegg/update_ratio"] for r in hist if r["server/fedegg/gate"]]
    return len(guided), (sum(guided) / len(guided) if guided else 0.0)


def per_seed(values: list[float], fmt: str) -> str:
    """The values seed by seed, "a / b / c": a table's per-seed cells (what experiments/regenerate_check.py compares
    when it reruns a sample of the seeds)."""
    return " / ".join(f"{v:{fmt}}" for v in values)


def strength(seeds: list[int], methods: list[str] | None = None) -> str:

    names = methods or list(METHODS)
    order = " / ".join(str(s) for s in seeds)
    variants = list(STRENGTH)
    out = []
    for setting in SETTINGS:
        head = " | ".join(f"+ {v}: Δ (seeds {order}) | guided | ratio" for v in variants)
        table = [
            f"### {setting.replace('dir', 'Dir(')})",
            "",
            f"| method | alone (seeds {order}) | {head} |",
            "|---|---|" + "---|---|---|" * len(variants),
        ]
        paired = [
            "",
            "| method | " + " | ".join(f"+ {v} − alone: mean ± SE [95 % interval]" for v in variants) + " |",
            "|---|" + "---|" * len(variants),
        ]
        for name in names:
            plain = [last_acc(strength_run(setting, name, None, s)) for s in seeds]
            row = [name, f"{mean_std(plain)} ({per_seed(plain, '.2f')})"]
            intervals = [name]
            for variant in variants:
                dirs = [strength_run(setting, name, variant, s) for s in seeds]
                deltas = [last_acc(d) - p for d, p in zip(dirs, plain)]
                logs = [guided_log(d) for d in dirs]
                ratios = [r for _, r in logs]
                row += [
                    f"{sum(deltas) / len(deltas):+.2f} ({per_seed(deltas, '+.2f')})",
                    " / ".join(str(g) for g, _ in logs),
                    f"{sum(ratios) / len(ratios):.3f} ({per_seed(ratios, '.3f')})",
                ]
                intervals.append(interval_cell(deltas))
            table.append("| " + " | ".join(row) + " |")
            paired.append("| " + " | ".join(intervals) + " |")
        out += [*table, *paired, ""]
    out.append(
        "alone: test accuracy of the method without FedEGG (last 10 of 60 rounds), mean ± SD (sample) over seeds, then "
        "per seed; Δ: + FedEGG minus alone, mean (per seed, paired); guided: rounds the gate opened, per seed (of 60); "
        "ratio: the mean over guided rounds of server/fedegg/update_ratio = ‖W_t − W̄_t‖ / ‖W̄_t − W_{t−1}‖, mean "
        "over seeds (per seed). Second table: the paired Δ's mean, its SE (SD of the per-seed Δ / √seeds) and 95 % "
        "interval (Student's t, flsuite.compare.paired_difference); resolved = the interval excludes 0. The training "
        "noise alone on fixed clients is docs/results/fedegg_noise.md. FedNova here is sample-weighted FedAvg: "
        "every client runs the same 5 local steps (a_k = 5), so its normalisation does nothing; the FedNova-FedAvg gap "
        "is sample against uniform weighting."
    )
    return "\n".join(out)


#: The training-noise study (issue 38): a method (FedAvg unless `--methods`) and it + FedEGG-LH in the paper's form and
#: with the shared head, on fixed clients (a data seed) repeated over training seeds, beside the strength study's seeds
#: 0, 1, 2 (seed = data seed = training seed), whose runs it shares: a run whose training seed equals its data seed is
#: that study's run. Keys: the variant's label after the method's name.
NOISE = {"": None, " + LH": "LH", " + LH shared": "LH shared"}
STRENGTH_SEEDS = [0, 1, 2]


def noise_runs(data_seeds: list[int], train_seeds: list[int], methods: list[str] | None = None) -> list[tuple]:
    """Every (setting, variant, data seed, training seed, method) of the noise study, training seed by training
    seed."""
    return [
        (s, v, d, t, m)
        for m in methods or ["FedAvg"]
        for s in SETTINGS
        for d in data_seeds
        for t in train_seeds
        for v in NOISE.values()
    ]


def noise_run(setting: str, variant: str | None, data_seed: int, train_seed: int, method: str = "FedAvg") -> Path:
    if train_seed == data_seed:
        return strength_run(setting, method, variant, data_seed)
    label = method if variant is None else f"{method} + {variant}"
    overlay = [*METHODS[method], *([] if variant is None else [LEVELS["LH"]])]
    return run(
        "noise", setting, label, overlay, data_seed, step_args=STRENGTH.get(variant or ""), train_seed=train_seed
    )


def noise(data_seeds: list[int], train_seeds: list[int], methods: list[str] | None = None) -> str:
    out = []
    for setting in SETTINGS:
        out += [f"### {setting.replace('dir', 'Dir(')})", ""]
        for method in methods or ["FedAvg"]:
            out += noise_tables(setting, method, data_seeds, train_seeds)
    out.append(
        "Test accuracy of the global model, last 10 of 60 rounds. Data seed: the clients (partition, subsets, test "
        "split); training seed: initialisation, client sampling, batch order (flsuite.seeding). Cells: mean ± SD "
        "(sample) over the training seeds on one data seed's clients; training-noise SD: pooled within data seeds. "
        "Pairs: A − B on the same (data seed, training seed), SE = SD of the differences / √n, 95 % interval with "
        "Student's t (flsuite.compare.paired_difference); per run in (data seed, training seed) order. The run whose "
        "training seed equals its data seed is the strength study's run of that seed (runs/fedegg/strength)."
    )
    return "\n".join(out)


def noise_tables(setting: str, method: str, data_seeds: list[int], train_seeds: list[int]) -> list[str]:
    """The noise study's two tables for one method in one setting: the variants per data seed with the pooled
    training-noise SD, and each variant's paired difference against the method alone."""
    from flsuite.compare import paired_difference

    labels = {f"{method}{suffix}": v for suffix, v in NOISE.items()}
    acc = {
        (label, d, t): last_acc(noise_run(setting, v, d, t, method))
        for label, v in labels.items()
        for d in data_seeds
        for t in train_seeds
    }
    seeded = {
        label: [last_acc(strength_run(setting, method, v, s)) for s in STRENGTH_SEEDS] for label, v in labels.items()
    }
    strength_seeds = ", ".join(map(str, STRENGTH_SEEDS))
    per_data = " | ".join(f"data seed {d}: {len(train_seeds)} training seeds" for d in data_seeds)
    out = [
        f"| variant | {per_data} | training-noise SD | strength table: seeds {strength_seeds} |",
        "|---|" + "---|" * len(data_seeds) + "---|---|",
    ]
    for label in labels:
        cells = [mean_std([acc[(label, d, t)] for t in train_seeds]) for d in data_seeds]
        within = [
            acc[(label, d, t)] - sum(acc[(label, d, u)] for u in train_seeds) / len(train_seeds)
            for d in data_seeds
            for t in train_seeds
        ]
        sd = math.sqrt(sum(w * w for w in within) / (len(within) - len(data_seeds)))
        out.append(f"| {label} | {' | '.join(cells)} | {sd:.2f} | {mean_std(seeded[label])} |")
    out += [
        "",
        "| pair | mean | SE | 95 % interval | per run | A above B | verdict | strength table: per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = [(d, t) for d in data_seeds for t in train_seeds]
    for label in list(labels)[1:]:
        diff = paired_difference({k: acc[(label, *k)] for k in keys}, {k: acc[(method, *k)] for k in keys})
        mean, se, interval, verdict = diff.cells()
        wins = sum(v > 0 for v in diff.diffs)
        seeded_diff = " / ".join(f"{a - b:+.2f}" for a, b in zip(seeded[label], seeded[method]))
        per_run = ", ".join(f"{v:+.2f}" for v in diff.diffs)
        out.append(
            f"| {label} − {method} | {mean} | {se} | {interval} | {per_run} | {wins} of {diff.n} | {verdict} "
            f"| {seeded_diff} |"
        )
    return [*out, ""]


def interval_cell(deltas: list[float]) -> str:
    """A paired Δ's cell: mean ± SE [95 % interval], verdict (flsuite.compare.PairedDifference); one pair: the mean
    and its verdict."""
    from flsuite.compare import PairedDifference

    diff = PairedDifference(tuple(deltas))
    mean, se, interval, verdict = diff.cells()
    return f"{mean} ± {se} {interval}, {verdict}" if diff.n > 1 else f"{mean}, {verdict}"


def against_fedavg(accs: list[float], plain: list[float]) -> str:
    """The paired change against FedAvg's runs of the same seeds: per seed, then its `interval_cell`."""
    deltas = [a - p for a, p in zip(accs, plain)]
    return f"{per_seed(deltas, '+.2f')} | {interval_cell(deltas)}"


PAIRED_NOTE = (
    "Δ vs FedAvg: the run minus FedAvg's run of the same seed (same clients, initialisation and sampling), per seed, "
    "then mean ± SE (SD of the per-seed Δ / √seeds) and 95 % interval (Student's t, "
    "flsuite.compare.paired_difference); resolved = the interval excludes 0."
)


def levels(seeds: list[int]) -> str:
    lines = [
        "| variant | test acc (last 10) | τ (Eq. 3) | rounds guided | Δ vs FedAvg per seed | Δ: mean ± SE [95 %] |",
        "|---|---|---|---|---|---|",
    ]
    plain = [last_acc(run("table", "dir0.1", "FedAvg", [], s)) for s in seeds]
    lines.append(f"| FedAvg | {mean_std(plain)} | – | – | – | – |")
    for level, overlay in LEVELS.items():
        dirs = [run("table" if level == "LH" else "levels", "dir0.1", f"FedAvg + {level}", [overlay], s) for s in seeds]
        logs = [fedegg_log(d) for d in dirs]
        accs = [last_acc(d) for d in dirs]
        lines.append(
            f"| FedAvg + FedEGG-{level} | {mean_std(accs)} | {mean_std([t for t, _ in logs])} | "
            f"{mean_std([float(g) for _, g in logs])} | {against_fedavg(accs, plain)} |"
        )
    return "\n".join([*lines, "", PAIRED_NOTE])


def tau_sweep(seeds: list[int], taus: list[float]) -> str:
    eq3 = [fedegg_log(run("table", "dir0.1", "FedAvg + LH", [LEVELS["LH"]], s))[0] for s in seeds]
    lines = [
        f"Eq. 3's τ (LH, Dir(0.1)): {mean_std(eq3)}",
        "",
        "| τ | test acc (last 10) | rounds guided | Δ vs FedAvg per seed | Δ: mean ± SE [95 %] |",
        "|---|---|---|---|---|",
    ]
    plain = [last_acc(run("table", "dir0.1", "FedAvg", [], s)) for s in seeds]
    lines.append(f"| −∞ (FedAvg) | {mean_std(plain)} | 0 | – | – |")
    points = sorted([(t, False) for t in taus] + [(sum(eq3) / len(eq3), True)])
    for tau, is_eq3 in points:
        if is_eq3:
            dirs = [run("table", "dir0.1", "FedAvg + LH", [LEVELS["LH"]], s) for s in seeds]
        else:
            dirs = [run("tau", "dir0.1", f"tau{tau:+.2f}", [LEVELS["LH"]], s, tau) for s in seeds]
        guided = [float(fedegg_log(d)[1]) for d in dirs]
        accs = [last_acc(d) for d in dirs]
        mark = " **(Eq. 3)**" if is_eq3 else ""
        lines.append(f"| {tau:+.2f}{mark} | {mean_std(accs)} | {mean_std(guided)} | {against_fedavg(accs, plain)} |")
    return "\n".join([*lines, "", PAIRED_NOTE])


def convergence(seeds: list[int], out: Path) -> None:
    """The FL training loss per round with and without FedEGG-LH (the paper's Fig. 2): the mean over `seeds` as a
    line, min-max over seeds shaded; ticks at the rounds where guiding ran, taller the more seeds it ran on."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, setting in zip(axes, SETTINGS):
        for colour, (label, overlay) in zip(("C0", "C1"), (("FedAvg", []), ("FedAvg + LH", [LEVELS["LH"]]))):
            hists = [records(run("table", setting, label, overlay, seed)) for seed in seeds]
            rounds = [r["round"] for r in hists[0]]
            loss = np.array([[r["train_loss"] for r in h] for h in hists])
            ax.plot(rounds, loss.mean(0), color=colour, label=label)
            ax.fill_between(rounds, loss.min(0), loss.max(0), color=colour, alpha=0.2)
            if overlay:
                guided = np.array([[bool(r["server/fedegg/gate"]) for r in h] for h in hists]).sum(0)
                ax.vlines(
                    [r for r, n in zip(rounds, guided) if n],
                    0.0,
                    [0.02 * (1 + n / len(seeds)) for n in guided if n],
                    color=colour,
                    lw=0.8,
                    label="guiding ran (height: seeds)",
                )
        ax.set_title(f"MNIST {setting.replace('dir', 'Dir(')}), {len(seeds)} seed(s): mean, min-max shaded")
        ax.set_xlabel("round")
        ax.set_yscale("log")
        ax.legend()
    axes[0].set_ylabel("FL training loss")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", choices=["table", "levels", "tau", "convergence", "strength", "noise"], required=True)
    p.add_argument("--part", default=None, help="N/M: run only the N-th of M slices of the study's runs (no table)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        help="strength: only these rows (default: all); noise: these (FedAvg)",
    )
    p.add_argument("--runs", type=Path, default=RUNS, help=f"where the runs go (default {RUNS})")
    p.add_argument("--train_seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="noise: training seeds")
    p.add_argument("--taus", type=float, nargs="+", default=[-3.0, -2.0, -1.0, 0.0, 1.0])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    globals()["RUNS"] = args.runs  # every run() of this process writes under it
    if args.methods and args.study not in ("strength", "noise"):
        p.error("--methods is for --study strength or noise")
    if args.part:
        if args.study not in ("strength", "noise"):
            p.error("--part is for --study strength or noise")
        n, m = (int(v) for v in args.part.split("/"))
        if args.study == "strength":
            for item in strength_runs(args.seeds, args.methods)[n - 1 :: m]:
                strength_run(*item)
        else:
            for item in noise_runs(args.seeds, args.train_seeds, args.methods)[n - 1 :: m]:
                noise_run(*item)
        return
    if args.out is None:
        p.error("--out is required (but with --part)")
    if args.study == "convergence":
        convergence(args.seeds, args.out)
        return
    body = {
        "table": table,
        "levels": levels,
        "tau": lambda s: tau_sweep(s, args.taus),
        "strength": lambda s: strength(s, args.methods),
        "noise": lambda s: noise(s, args.train_seeds, args.methods),
    }[args.study](args.seeds)
    taus = f" --taus {' '.join(map(str, args.taus))}" if args.study == "tau" else ""
    if args.study == "noise":
        taus = f" --train_seeds {' '.join(map(str, args.train_seeds))}"
    if args.methods:
        taus += f" --methods {' '.join(args.methods)}"
    command = (
        f"OMP_NUM_THREADS=1 python experiments/fedegg_study.py --study {args.study} "
        f"--seeds {' '.join(map(str, args.seeds))}{taus} --out {args.out}"
    )
    args.out.write_text(f"<!-- regenerate: {command} -->\n{body}\n")
    print(body)


if __name__ == "__main__":
    main()
