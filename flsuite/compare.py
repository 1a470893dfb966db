"""`flsuite compare RUNS...`: compare methods across finished runs (Markdown, a self-contained HTML page, one PNG).

    flsuite compare runs/my_study                      # a study folder: every run folder below it
    flsuite compare runs/fedavg/*-seed* runs/fedprox   # run folders, globs, or folders of runs
    flsuite compare runs/a runs/b                      # two runs side by side: one row per experiment
    flsuite compare runs/my_study --out reports/my_study --target 80

Decisions:
- A run folder is a folder holding `summary.json` (finished runs; unfinished ones are listed as skipped). By default
  runs are grouped by what they computed, never by where they sit: two runs are one group exactly when their resolved
  configs (`config.yaml`) are equal except for the seed and the keys that only say how or where a run executed
  (`EXECUTION_KEYS`: run_dir, output_dir, name, wandb.*, progress, executor.*, threads.*, ...; `last_k` is not one of
  them, it changes the final numbers). So a group never mixes methods or datasets. A group is labelled by its method
  (the method's class name joined with the setup stages', as W&B's job_type: `FedAvg+GGEUR`) plus, where several groups
  share a method, every config key whose values tell them apart (`FedProx (method.init_args.mu=0.01)`), so labels are
  unique. A run whose config.yaml names no method (not written by `flsuite fit`) is grouped by its folder.
  `--by folder` groups by parent folder (labels: the folders' names, or their paths below the runs' common folder
  when two share a name), and stops, naming the keys, if a folder holds runs of different experiments; `--by KEY...`
  groups by config values (e.g. a sweep's trials by the swept option), on purpose across the other keys. Callers
  (study.py) pass labelled groups directly, which are checked like folders.
- Final numbers come from each run's `summary.json` with the prefix it was written with (`last{k}/`, k = the run's
  `last_k`); a group whose runs used different k is an error. Per domain, AVG (mean over domains), STD (population
  std across domains of the last-k mean accuracies, GGEUR) and STD (n-1) (sample std, FKPL) are shown as
  mean ± population std over the group's runs (seeds). The STDs are recomputed from the per-domain last-k numbers,
  so summaries written before that became the summary's own arithmetic compare on the same footing.
- Rounds to target: the first round whose acc_mean reaches `--target` (from metrics.jsonl), else the runs' own
  `target_acc` from their summary; shown as the mean over the runs that reached it and how many did.
- Bytes per round: mean over the round records of every `Rounds` phase (a record with `<prefix>clients` and
  `<prefix>bytes_up`: plain rounds, FKPL's `expert<v>/` rounds) of their `bytes_up`/`bytes_down` (the whole round's
  traffic); time per round: mean of those phases' `<prefix>time/round_s` (timings.jsonl). Bytes per run: the run's
  whole traffic — every round record, every client query (`query/<name>/bytes_*` in summary.json) and the setup
  stages' exchanges (`setup/<stage>/bytes_*` in setup.json, GGEUR's statistics) — so a protocol whose rounds are
  not its only traffic (FKPL's Stage 0 and Stage II uploads) is counted whole. All averaged over runs.
- Convergence: acc_mean per round, the mean over runs as a line and mean ± std over runs shaded, every group on one
  PNG, over the rounds all of a group's runs evaluated.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import glob
import html
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import yaml

from flsuite.metrics import ACC_PREFIX, summary_prefix
from flsuite.runfolder import ALLOWED_CHANGES, flatten

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One finished run folder, read once."""

    path: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    timings: list[dict[str, Any]]
    config: dict[str, Any]
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return summary_prefix(self.summary)

    @property
    def domains(self) -> list[str]:
        start = self.prefix + ACC_PREFIX
        return [k.removeprefix(start) for k in self.summary if k.startswith(start)]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(path: Path) -> Run:
    """Read a run folder's summary, metrics, timings and config."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{summary_file} does not exist (not a finished flsuite run folder)")
    summary = json.loads(summary_file.read_text())
    try:
        summary_prefix(summary)
    except KeyError as err:
        raise ValueError(f"{summary_file}: {err.args[0]}") from None
    setup_file = path / "setup.json"
    setup = json.loads(setup_file.read_text()) if setup_file.is_file() else {}
    return Run(path, summary, _jsonl(path / "metrics.jsonl"), _jsonl(path / "timings.jsonl"), read_config(path), setup)


def find_runs(patterns: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """Run folders from folders, globs or study folders: (finished runs, unfinished ones skipped), sorted."""
    found: set[Path] = set()
    skipped: set[Path] = set()
    for pattern in patterns:
        matches = [Path(m) for m in sorted(glob.glob(str(pattern)))] or [Path(pattern)]
        for match in matches:
            if not match.exists():
                raise FileNotFoundError(f"{pattern}: no such run folder, study folder or glob match")
            if (match / "summary.json").is_file():
                found.add(match)
            elif (match / "metrics.jsonl").is_file():
                skipped.add(match)
            elif match.is_dir():
                found |= {p.parent for p in match.rglob("summary.json")}
                skipped |= {p.parent for p in match.rglob("metrics.jsonl") if not (p.parent / "summary.json").is_file()}
    if not found:
        raise FileNotFoundError(f"no finished run folder (with summary.json) under {', '.join(map(str, patterns))}")
    return sorted(found), sorted(skipped)


def group_by_parent(runs: Sequence[Path]) -> dict[str, list[Path]]:
    """Group run folders by their parent folder, labelled by its name (or its path below the common folder)."""
    parents = sorted({Path(r).parent for r in runs})
    names = [p.name for p in parents]
    if len(set(names)) < len(names):
        common = Path(os.path.commonpath([str(p) for p in parents]))
        names = [str(p.relative_to(common)) for p in parents]
    label = dict(zip(parents, names))
    groups: dict[str, list[Path]] = {}
    for r in sorted(runs):
        groups.setdefault(label[Path(r).parent], []).append(Path(r))
    return groups


#: Config keys that say how or where a run executed, not what it computed (the resume check's allowed changes, less
#: `last_k`, which changes the final numbers), plus the seed and `resume` (in a `--print_config` dump fed back).
EXECUTION_KEYS = (*(k for k in ALLOWED_CHANGES if k != "last_k"), "seed", "resume")


def read_config(run: Path) -> dict[str, Any]:
    config_file = Path(run) / "config.yaml"
    return (yaml.safe_load(config_file.read_text()) if config_file.is_file() else None) or {}


def experiment(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config as dotted keys, without the keys that do not change the experiment (`EXECUTION_KEYS`)."""
    return {k: v for k, v in flatten(config).items() if not any(fnmatch.fnmatchcase(k, p) for p in EXECUTION_KEYS)}


def _short(class_path: Any) -> str:
    return str(class_path).rsplit(".", 1)[-1]


def method_label(config: Mapping[str, Any]) -> str | None:
    """The method's class name joined with the setup stages' (`FedAvg+GGEUR`, as `tracking.run_labels`), from a
    resolved config; None when the config names no method."""
    method = config.get("method")
    if not isinstance(method, Mapping) or "class_path" not in method:
        return None
    stages = [_short(s["class_path"]) for s in config.get("setup") or [] if isinstance(s, Mapping) and "class_path" in s]
    return "+".join([_short(method["class_path"]), *stages])


def _show(flat: Mapping[str, Any], key: str) -> str:
    if key not in flat:
        return "—"
    value = flat[key]
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)


def differing_keys(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """Dotted keys whose value (or presence) is not the same in every one of `flats`, sorted."""
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({_show(f, k) for f in flats}) > 1]


def group_by_experiment(runs: Sequence[Path]) -> dict[str, list[Path]]:
    """Group run folders by their config without the seed and `EXECUTION_KEYS`, labelled by method (+ setup stages)
    and, where several groups share a method, the keys that tell them apart; in the order of the sorted runs."""
    members: dict[str, list[Path]] = {}
    flats: dict[str, dict[str, Any]] = {}
    methods: dict[str, str] = {}
    for r in sorted(map(Path, runs)):
        config = read_config(r)
        method = method_label(config)
        flat = experiment(config) if method else {"(folder)": str(r.parent)}
        key = json.dumps(flat, sort_keys=True, default=str)
        members.setdefault(key, []).append(r)
        flats[key], methods[key] = flat, method or r.parent.name
    labels: dict[str, str] = {}
    for method in dict.fromkeys(methods.values()):
        keys = [k for k in members if methods[k] == method]
        shown = differing_keys([flats[k] for k in keys])  # none for a method's only group
        for k in keys:
            parts = ", ".join(f"{d}={_show(flats[k], d)}" for d in shown)
            labels[k] = f"{method} ({parts})" if parts else method
    return {labels[k]: paths for k, paths in members.items()}


def check_one_experiment(label: str, runs: Sequence[Run]) -> None:
    """Stop if a labelled group holds runs of different experiments (configs differing beyond the seed and
    `EXECUTION_KEYS`), naming the group and the keys (runs without a config.yaml cannot be told apart)."""
    if len(runs) > 1 and all(r.config for r in runs) and (keys := differing_keys([experiment(r.config) for r in runs])):
        shown = ", ".join(keys[:4]) + (f" (and {len(keys) - 4} more)" if len(keys) > 4 else "")
        raise ValueError(f"group {label!r} holds runs of different experiments (their config.yaml differ in {shown}), "
                         "so it cannot be averaged as seeds of one; `flsuite compare` without --by groups runs by config")


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """A dotted key of a resolved config (`method.init_args.mu`); a list (setup stages) is entered at its last item."""
    node: Any = config
    for part in key.split("."):
        node = node[-1] if isinstance(node, list) and node else node
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def group_by_config(runs: Sequence[Path], keys: Sequence[str]) -> dict[str, list[Path]]:
    """Group run folders by the values of config keys (from each run's config.yaml), e.g. a sweep's trials by the
    swept option; labelled `key=value, ...` with the last dotted part of each key."""
    groups: dict[str, list[Path]] = {}
    for r in sorted(runs):
        config = read_config(r)
        try:
            label = ", ".join(f"{k.rsplit('.', 1)[-1]}={config_value(config, k)}" for k in keys)
        except KeyError as err:
            raise KeyError(f"{Path(r) / 'config.yaml'}: no config key {err.args[0]!r} to group by") from None
        groups.setdefault(label, []).append(Path(r))
    return groups


@dataclass
class GroupStats:
    """A group's numbers; each accuracy entry is the list of per-run values."""

    label: str
    runs: list[Run]
    k: int
    rounds_averaged: list[int]
    acc: dict[str, list[float]] = field(default_factory=dict)  # domain -> per-run last-k accuracy
    avg: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    std_sample: list[float] = field(default_factory=list)
    rounds_to_target: list[int | None] = field(default_factory=list)
    target: float | None = None
    bytes_up: list[float] = field(default_factory=list)
    bytes_down: list[float] = field(default_factory=list)
    run_bytes_up: list[float] = field(default_factory=list)
    run_bytes_down: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)

    def seeds(self) -> str:
        """How many seeds the group averages, and how many runs when a seed was run twice."""
        seeds = {r.config.get("seed", i) for i, r in enumerate(self.runs)}
        return str(len(seeds)) if len(seeds) == len(self.runs) else f"{len(seeds)} ({len(self.runs)} runs)"


def domain_std(summary: Mapping[str, Any]) -> tuple[float, float | None]:
    """Population and sample (None for one domain) std across domains of a summary's last-k mean accuracies.

    Recomputed from the per-domain numbers, so summaries written before the final STD took the papers' arithmetic
    (when `last{k}/acc_std` was the mean of the per-round STDs) are compared on the same footing.
    """
    prefix = summary_prefix(summary)
    values = np.array([float(v) for k, v in summary.items() if k.startswith(prefix + ACC_PREFIX)], dtype=np.float64)
    return float(values.std(ddof=0)), (float(values.std(ddof=1)) if len(values) > 1 else None)


def round_prefixes(record: Mapping[str, Any]) -> list[str]:
    """The metric prefixes under which `record` holds a round of a `Rounds` phase ("" for plain rounds)."""
    return [k.removesuffix("clients") for k in record
            if (k == "clients" or k.endswith("/clients")) and f"{k.removesuffix('clients')}bytes_up" in record]


def round_traffic(history: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(bytes up, bytes down) of every round of every `Rounds` phase, in record order."""
    return [(float(r[f"{p}bytes_up"]), float(r.get(f"{p}bytes_down", 0))) for r in history for p in round_prefixes(r)]


def run_traffic(run: Run) -> tuple[float, float]:
    """Everything the run communicated: its rounds, its client queries and its setup stages' exchanges."""
    rounds = round_traffic(run.history)
    total = {"bytes_up": sum(u for u, _ in rounds), "bytes_down": sum(d for _, d in rounds)}
    for source, first in ((run.summary, "query"), (run.setup, "setup")):
        for key, value in source.items():
            parts = key.split("/")
            if len(parts) >= 3 and parts[0] == first and parts[-1] in total:
                total[parts[-1]] += value
    return float(total["bytes_up"]), float(total["bytes_down"])


def first_round_reaching(history: Sequence[Mapping[str, Any]], target: float) -> int | None:
    for r in history:
        if "acc_mean" in r and float(r["acc_mean"]) >= target:
            return int(r["round"])
    return None


def group_stats(label: str, runs: Sequence[Run], target: float | None = None) -> GroupStats:
    prefixes = {r.prefix for r in runs}
    if len(prefixes) > 1:
        raise ValueError(f"group {label!r} mixes runs with different last_k ({', '.join(sorted(prefixes))}): compare like with like")
    prefix = prefixes.pop()
    k = int(prefix.removeprefix("last").rstrip("/"))
    g = GroupStats(label, list(runs), k, [int(r.summary.get(f"{prefix}rounds", k)) for r in runs])
    for run in runs:
        s = run.summary
        for d in run.domains:
            g.acc.setdefault(d, []).append(float(s[f"{prefix}{ACC_PREFIX}{d}"]))
        g.avg.append(float(s[f"{prefix}acc_mean"]))
        std, std_sample = domain_std(s)
        g.std.append(std)
        if std_sample is not None:
            g.std_sample.append(std_sample)
        run_target = target if target is not None else s.get("target_acc")
        if run_target is not None:
            g.target = float(run_target)
            g.rounds_to_target.append(first_round_reaching(run.history, float(run_target)))
        traffic = round_traffic(run.history)
        if traffic:
            g.bytes_up.append(float(np.mean([u for u, _ in traffic])))
            g.bytes_down.append(float(np.mean([d for _, d in traffic])))
        total_up, total_down = run_traffic(run)
        g.run_bytes_up.append(total_up)
        g.run_bytes_down.append(total_down)
        times = [v for t in run.timings for k, v in t.items() if k == "time/round_s" or k.endswith("/time/round_s")]
        if times:
            g.round_s.append(float(np.mean(times)))
    return g


def mean_pm(values: Sequence[float], digits: int = 2) -> str:
    """`mean ± std` (population std over runs), or the value alone for one run, or "—" for none."""
    if not values:
        return "—"
    v = np.asarray(values, dtype=np.float64)
    return f"{v.mean():.{digits}f} ± {v.std(ddof=0):.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _rounds_cell(g: GroupStats) -> str:
    if g.target is None:
        return "—"
    reached = [r for r in g.rounds_to_target if r is not None]
    mean = f"{np.mean(reached):.1f}" if reached else "never"
    return f"{mean} ({len(reached)}/{len(g.rounds_to_target)})"


@dataclass
class Comparison:
    """The compared groups, as tables (rows of cells) that Markdown and HTML both render."""

    groups: list[GroupStats]
    skipped: list[Path] = field(default_factory=list)

    @property
    def domains(self) -> list[str]:
        out: list[str] = []
        for g in self.groups:
            out += [d for d in g.acc if d not in out]
        return out

    def accuracy_rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["method", *self.domains, "AVG", "STD", "STD (n-1)", "seeds"]
        rows = []
        for g in self.groups:
            rows.append([g.label, *[mean_pm(g.acc.get(d, [])) for d in self.domains], mean_pm(g.avg), mean_pm(g.std),
                         mean_pm(g.std_sample), g.seeds()])
        return header, rows

    def cost_rows(self) -> tuple[list[str], list[list[str]]]:
        targets = {g.target for g in self.groups if g.target is not None}
        target = f"rounds to {targets.pop():g}%" if len(targets) == 1 else "rounds to target"
        header = ["method", "last-k", target, "bytes up / round", "bytes down / round", "bytes up / run", "bytes down / run", "s / round"]
        rows = []
        for g in self.groups:
            averaged = min(g.rounds_averaged)
            k = str(g.k) if averaged >= g.k else f"{g.k} (a run averaged only {averaged})"
            rows.append([g.label, k, _rounds_cell(g),
                         human_bytes(float(np.mean(g.bytes_up))) if g.bytes_up else "—",
                         human_bytes(float(np.mean(g.bytes_down))) if g.bytes_down else "—",
                         human_bytes(float(np.mean(g.run_bytes_up))), human_bytes(float(np.mean(g.run_bytes_down))),
                         f"{np.mean(g.round_s):.2f}" if g.round_s else "—"])
        return header, rows

    def note(self) -> str:
        ks = sorted({g.k for g in self.groups})
        k = ks[0] if len(ks) == 1 else "k (per method, see below)"
        return (f"Top-1 accuracy (%) averaged over each run's last {k} evaluated rounds; mean ± std over seeds (population). "
                "AVG = mean over domains; STD = population std across domains of the last-k mean accuracies (GGEUR's "
                "convention); STD (n-1) = sample std (FKPL's).")

    def markdown(self, title: str | None = None, png: str | None = None) -> str:
        lines = [f"## {title}", ""] if title else []
        lines += [self.note(), "", *_md_table(*self.accuracy_rows()), "", *_md_table(*self.cost_rows()), ""]
        if png:
            lines += [f"![convergence]({png})", ""]
        if self.skipped:
            lines += ["Skipped (unfinished, no summary.json): " + ", ".join(str(p) for p in self.skipped), ""]
        return "\n".join(lines)

    def html(self, title: str, png: bytes | None = None) -> str:
        """One self-contained page: both tables and the convergence PNG embedded as base64."""
        parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
                 "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
                 "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
                 "</style></head><body>", f"<h2>{html.escape(title)}</h2>", f"<p>{html.escape(self.note())}</p>",
                 _html_table(*self.accuracy_rows()), _html_table(*self.cost_rows())]
        if png:
            parts.append(f"<img alt='convergence' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
        if self.skipped:
            parts.append("<p>Skipped (unfinished): " + html.escape(", ".join(str(p) for p in self.skipped)) + "</p>")
        return "\n".join(parts + ["</body></html>", ""])

    def plot(self, path: Path | BinaryIO) -> None:
        """acc_mean per round of every group on one figure: mean over runs, shaded mean ± std over runs."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for g in self.groups:
            curves = [{int(r["round"]): float(r["acc_mean"]) for r in run.history if "acc_mean" in r} for run in g.runs]
            rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not rounds:
                continue
            values = np.array([[c[r] for r in rounds] for c in curves])
            mean, std = values.mean(axis=0), values.std(axis=0)
            (line,) = ax.plot(rounds, mean, lw=1.8, label=f"{g.label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # rounds are whole numbers
        ax.set_xlabel("round")
        ax.set_ylabel("mean test accuracy over domains (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def compare(groups: Mapping[str, Sequence[Path]], target: float | None = None, skipped: Sequence[Path] = (),
            across_configs: bool = False) -> Comparison:
    """Compare labelled groups of run folders (label -> run folders); groups with no finished run are left out.
    Each group must be seeds of one experiment (`check_one_experiment`) unless `across_configs` (`--by KEY`)."""
    stats = []
    for label, paths in groups.items():
        runs = [load_run(p) for p in paths]
        if not across_configs:
            check_one_experiment(label, runs)
        if runs:
            stats.append(group_stats(label, runs, target))
    if not stats:
        raise FileNotFoundError("no finished runs to compare")
    return Comparison(stats, list(skipped))


def write_report(comparison: Comparison, out: Path, title: str) -> dict[str, Path]:
    """Write `compare.md`, `compare.html` (self-contained) and `convergence.png` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    png = out / "convergence.png"
    comparison.plot(png)
    files = {"markdown": out / "compare.md", "html": out / "compare.html", "png": png}
    files["markdown"].write_text(comparison.markdown(title, png=png.name))
    files["html"].write_text(comparison.html(title, png.read_bytes()))
    return files


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flsuite compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run folders, globs (quote them) or study folders")
    ap.add_argument("--out", type=Path, help="write compare.md, compare.html and convergence.png into this folder")
    ap.add_argument("--target", type=float, help="report the first round whose acc_mean reaches this accuracy (%%)")
    ap.add_argument("--title", default="Method comparison")
    ap.add_argument("--by", nargs="+", metavar="KEY",
                    help="group by parent folder ('folder') or by these config keys (e.g. a sweep's swept option) instead of "
                         "by experiment (equal configs but for the seed and where/how a run executed)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    runs, skipped = find_runs(args.runs)
    if args.by == ["folder"]:
        groups, across_configs = group_by_parent(runs), False
    elif args.by:
        groups, across_configs = group_by_config(runs, args.by), True
    else:
        groups, across_configs = group_by_experiment(runs), False
    comparison = compare(groups, args.target, skipped, across_configs)
    if args.out:
        files = write_report(comparison, args.out, args.title)
        print(files["markdown"].read_text())
        print(f"wrote {', '.join(str(p) for p in files.values())}")
    else:
        print(comparison.markdown(args.title))
    return 0
