"""A group's numbers from its runs' records: last-k accuracies, the STDs across domains, rounds to target, traffic
per round and per run, seconds per round; paired differences between groups; and how they are printed (mean ± std
over runs, bytes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flsuite.compare.runs import Run
from flsuite.records import (
    ACC_MEAN,
    ACC_PREFIX,
    BYTES_DOWN,
    BYTES_UP,
    CLIENTS,
    LAST_K_ROUNDS,
    ROUND,
    ROUND_SECONDS,
    TARGET_ACC,
    evaluated,
    last_k_of,
    query_totals,
    summary_prefix,
)
from flsuite.seeding import config_seeds


@dataclass
class GroupStats:
    """A group's numbers; each accuracy entry is the list of per-run values."""

    label: str
    runs: list[Run]
    k: int
    rounds_averaged: list[int]  # per run: evaluated rounds its last-k numbers average (fewer than k in a short run)
    rounds: list[int | None] = field(default_factory=list)  # per run: the last round it ran (`run_rounds`)
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
        """How many seeds the group averages — distinct (data seed, training seed) pairs (`flsuite.seeding.Seeds`) —
        and how many runs when a pair was run twice."""
        seeds = {config_seeds(r.config) or i for i, r in enumerate(self.runs)}
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
    return [
        k.removesuffix(CLIENTS)
        for k in record
        if (k == CLIENTS or k.endswith(f"/{CLIENTS}")) and f"{k.removesuffix(CLIENTS)}{BYTES_UP}" in record
    ]


def round_traffic(history: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(bytes up, bytes down) of every round of every `Rounds` phase, in record order."""
    return [
        (float(r[f"{p}{BYTES_UP}"]), float(r.get(f"{p}{BYTES_DOWN}", 0))) for r in history for p in round_prefixes(r)
    ]


def run_traffic(run: Run) -> tuple[float, float]:
    """Everything the run communicated: its rounds, its client queries and its setup stages' exchanges."""
    rounds = round_traffic(run.history)
    one_shot = query_totals(run.summary, run.setup)
    return (
        float(sum(u for u, _ in rounds) + one_shot[BYTES_UP]),
        float(sum(d for _, d in rounds) + one_shot[BYTES_DOWN]),
    )


def run_rounds(run: Run) -> int | None:
    """The rounds a run ran: the last round in its metrics.jsonl, else its config's `rounds` (None when neither
    says)."""
    rounds = [int(r[ROUND]) for r in run.history if ROUND in r]
    if rounds:
        return max(rounds)
    configured = run.config.get("rounds")
    return int(configured) if isinstance(configured, int) else None


def first_round_reaching(history: Sequence[Mapping[str, Any]], target: float) -> int | None:
    for r in evaluated(history):
        if float(r[ACC_MEAN]) >= target:
            return int(r[ROUND])
    return None


def group_stats(label: str, runs: Sequence[Run], target: float | None = None) -> GroupStats:
    prefixes = {r.prefix for r in runs}
    if len(prefixes) > 1:
        raise ValueError(
            f"group {label!r} mixes runs with different last_k ({', '.join(sorted(prefixes))}): compare like with like"
        )
    prefix = prefixes.pop()
    k = last_k_of(prefix)
    g = GroupStats(label, list(runs), k, [int(r.summary.get(f"{prefix}{LAST_K_ROUNDS}", k)) for r in runs])
    for run in runs:
        s = run.summary
        g.rounds.append(run_rounds(run))
        for d in run.domains:
            g.acc.setdefault(d, []).append(float(s[f"{prefix}{ACC_PREFIX}{d}"]))
        g.avg.append(float(s[f"{prefix}{ACC_MEAN}"]))
        std, std_sample = domain_std(s)
        g.std.append(std)
        if std_sample is not None:
            g.std_sample.append(std_sample)
        run_target = target if target is not None else s.get(TARGET_ACC)
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
        times = [v for t in run.timings for k, v in t.items() if k == ROUND_SECONDS or k.endswith(f"/{ROUND_SECONDS}")]
        if times:
            g.round_s.append(float(np.mean(times)))
    return g


@dataclass(frozen=True)
class PairedDifference:
    """A − B over the pairs both ran (same seeds): the mean, its standard error (sample std of the differences / √n)
    and the 95 % interval mean ± t(0.975, n − 1) · SE (Student's t over the pairs). A difference whose interval holds
    0 is not resolved; with fewer than 2 pairs there is no SE or interval, and nothing is resolved."""

    diffs: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.diffs)) if self.diffs else None

    @property
    def se(self) -> float | None:
        return float(np.std(self.diffs, ddof=1) / np.sqrt(self.n)) if self.n > 1 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.mean is None or self.se is None:
            return None
        from scipy.stats import t

        half = float(t.ppf(0.975, self.n - 1)) * self.se
        return self.mean - half, self.mean + half

    @property
    def resolved(self) -> bool:
        return self.interval is not None and not self.interval[0] <= 0.0 <= self.interval[1]

    def cells(self, digits: int = 2) -> list[str]:
        """[mean, SE, 95 % interval, verdict] as table cells."""
        if self.mean is None:
            return ["—", "—", "—", "no pair"]
        mean = f"{self.mean:+.{digits}f}"
        if self.interval is None:
            return [mean, "—", "—", "not resolved (1 pair)"]
        low, high = self.interval
        return [
            mean,
            f"{self.se:.{digits}f}",
            f"[{low:+.{digits}f}, {high:+.{digits}f}]",
            "resolved" if self.resolved else "not resolved",
        ]


def paired_difference(a: Mapping[Any, float], b: Mapping[Any, float]) -> PairedDifference:
    """A − B over the keys (seeds) both hold, in A's order."""
    return PairedDifference(tuple(float(a[k]) - float(b[k]) for k in a if k in b))


def pair_key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """What pairs a run with another group's: the data and training seeds its config ran with (`config_seeds`: a
    config with only `seed` pairs with one whose `data_seed` and `train_seed` equal it) and any other top-level
    `*_seed` key (None: the config records no seed, the run pairs with nothing)."""
    seeds = config_seeds(config)
    own = (("data_seed", seeds.data), ("train_seed", seeds.train)) if seeds is not None else ()
    key = own + tuple(
        (k, config[k]) for k in sorted(config) if k.endswith("_seed") and k not in ("data_seed", "train_seed")
    )
    return key or None


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
