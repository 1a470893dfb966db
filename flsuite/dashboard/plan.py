"""What a dashboard shows, as typed data built from the record schema (`flsuite.records`) and the keys the runs
logged (the panels it is made of: `flsuite.dashboard.panels`); `flsuite.dashboard.spec` turns it into W&B's own
workspace and report objects.

Decisions:
- Every key a panel names comes from `flsuite.records` (constants, `acc/<domain>`, last-k prefixes), never a literal
  here; a panel is kept only when the runs logged at least one of its keys (`RunKeys`), so a view never shows an
  empty panel for a method that did not run. Without an inventory (a dry run with no run folders) every declared
  panel is kept and the per-domain curves are one panel over the regex `acc/<domain>`.
- Runs are grouped by method (`job_type`, the method label flsuite gives every run) and shown as the mean over
  seeds with the standard deviation shaded (curves) or as error bars (bars).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flsuite import records
from flsuite.dashboard.panels import Bars, Curves, Importance, Panel, Parallel, Scalar
from flsuite.records import (
    ACC_MEAN,
    ACC_PREFIX,
    ACC_STD,
    ACC_STD_SAMPLE,
    BYTES_DOWN,
    BYTES_UP,
    CLIENTS_SECONDS,
    EVAL_SECONDS,
    FEDCIR_LOSS_SHARES,
    FEDEGG_GATE,
    FEDEGG_UPDATE_RATIO,
    FKPL_STAGE_BYTES_DOWN,
    FKPL_STAGE_BYTES_UP,
    FKPL_STAGE_SECONDS,
    PER_ROUND,
    ROUND,
    ROUND_SECONDS,
    TOTAL_BYTES_DOWN,
    TOTAL_BYTES_UP,
    VAL_PREFIX,
    last_k_prefix,
)


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class RunFilter:
    """Which runs a view shows: a W&B group (flsuite's `name`: one experiment or study), a tag, a sweep id; none:
    the whole project."""

    group: str | None = None
    tag: str | None = None
    sweep: str | None = None


@dataclass(frozen=True)
class View:
    """A workspace view: sections of panels over the filtered runs, grouped by method (`job_type`)."""

    name: str
    runs: RunFilter
    sections: tuple[Section, ...]
    by_method: bool = True  # a sweep's trials are one method: shown run by run

    def metric_keys(self) -> set[str]:
        """Every metric key a panel names (config keys of parallel coordinates and `round` left out)."""
        out: set[str] = set()
        for section in self.sections:
            for p in section.panels:
                if isinstance(p, Curves | Bars):
                    out.update(p.keys)
                elif isinstance(p, Scalar):
                    out.add(p.key)
                elif isinstance(p, Parallel | Importance):
                    out.add(p.metric)
        return out


@dataclass(frozen=True)
class RunKeys:
    """The keys runs logged to W&B: history (per round) and summary (final numbers, setup stages)."""

    history: frozenset[str]
    summary: frozenset[str]

    def has(self, key: str) -> bool:
        return key in self.history or key in self.summary

    @property
    def domains(self) -> list[str]:
        """Domain names of the runs' `acc/<domain>` keys, sorted."""
        return sorted(k.removeprefix(ACC_PREFIX) for k in self.history if k.startswith(ACC_PREFIX))

    @property
    def last_k_prefixes(self) -> list[str]:
        """The last-k prefixes the runs' summaries were written with (`last5/`), sorted by k."""
        found = {m.group(1) for k in self.summary if (m := re.fullmatch(r"(last\d+/)" + re.escape(ACC_MEAN), k))}
        return sorted(found, key=records.last_k_of)

    def merged(self, other: RunKeys) -> RunKeys:
        return RunKeys(self.history | other.history, self.summary | other.summary)


def _kept(panel: Panel, keys: RunKeys | None) -> Panel | None:
    """The panel with only the keys the runs logged (all of them with no inventory); None when none is left."""
    if keys is None:
        return panel
    if isinstance(panel, Curves | Bars):
        present = tuple(k for k in panel.keys if keys.has(k))
        return type(panel)(panel.title, present) if present else None
    if isinstance(panel, Scalar):
        return panel if keys.has(panel.key) else None
    return panel if keys.has(panel.metric) else None


def _section(name: str, panels: Iterable[Panel], keys: RunKeys | None) -> list[Section]:
    kept = tuple(p for p in (_kept(p, keys) for p in panels) if p is not None)
    return [Section(name, kept)] if kept else []


def headline_panels(prefix: str, domains: Sequence[str]) -> list[Panel]:
    """The study's final numbers under one last-k prefix: AVG and STD (population and sample) by method, per domain."""
    return [
        Bars(f"AVG ({prefix}{ACC_MEAN})", (prefix + ACC_MEAN,)),
        Bars(f"STD across domains ({prefix}{ACC_STD}, {ACC_STD_SAMPLE})", (prefix + ACC_STD, prefix + ACC_STD_SAMPLE)),
        Scalar(f"AVG over the shown runs ({prefix}{ACC_MEAN})", prefix + ACC_MEAN),
        *(
            [Bars(f"per domain ({prefix}{ACC_PREFIX}*)", tuple(prefix + ACC_PREFIX + d for d in domains))]
            if domains
            else []
        ),
    ]


def convergence_panels(domains: Sequence[str] | None) -> list[Panel]:
    """acc_mean, the STDs and each domain's accuracy against the round; `None` domains: one regex panel."""
    per_domain: list[Panel] = (
        [Curves(f"{ACC_PREFIX}{d}", (ACC_PREFIX + d,)) for d in domains]
        if domains is not None
        else [Curves(f"{ACC_PREFIX}<domain>", (), regex="^" + re.escape(ACC_PREFIX) + ".+")]
    )
    return [
        Curves(ACC_MEAN, (ACC_MEAN,)),
        Curves(f"{ACC_STD} / {ACC_STD_SAMPLE} across domains", (ACC_STD, ACC_STD_SAMPLE)),
        *per_domain,
        Curves(f"validation {ACC_MEAN}", (VAL_PREFIX + ACC_MEAN,)),
    ]


def project_view(
    keys: RunKeys | None, runs: RunFilter = RunFilter(), name: str = "flsuite: methods compared", last_k: int = 5
) -> View:
    """The method comparison of a project (or of one group or tag): headline numbers, convergence, communication,
    time per round and each method's own diagnostics, where the runs logged them."""
    domains = keys.domains if keys is not None else None
    prefixes = (keys.last_k_prefixes if keys is not None else []) or [last_k_prefix(last_k)]
    headline = [p for prefix in prefixes for p in headline_panels(prefix, domains or [])]
    sections = [
        *_section("Headline numbers (last-k AVG and STD by method)", headline, keys),
        *_section("Convergence", convergence_panels(domains), keys),
        *_section(
            "Communication",
            [
                Curves("bytes per round", (BYTES_UP, BYTES_DOWN)),
                Curves("bytes so far (cumulative)", (TOTAL_BYTES_UP, TOTAL_BYTES_DOWN)),
            ],
            keys,
        ),
        *_section(
            "Time per round",
            [
                Curves("seconds per round", (ROUND_SECONDS,)),
                Curves("clients and evaluation", (CLIENTS_SECONDS, EVAL_SECONDS)),
            ],
            keys,
        ),
        *_section(
            "FedEGG",
            [Curves("update ratio", (FEDEGG_UPDATE_RATIO,)), Curves("guided rounds (gate open = 1)", (FEDEGG_GATE,))],
            keys,
        ),
        *_section("FedCiR", [Curves("loss shares", FEDCIR_LOSS_SHARES)], keys),
        *_section(
            "FKPL",
            [
                Bars("stage bytes up", FKPL_STAGE_BYTES_UP),
                Bars("stage bytes down", FKPL_STAGE_BYTES_DOWN),
                Bars("stage seconds", FKPL_STAGE_SECONDS),
            ],
            keys,
        ),
    ]
    return View(name, runs, tuple(sections))


@dataclass(frozen=True)
class SweepFile:
    """What a W&B sweep file says that its view needs."""

    path: Path
    name: str
    project: str | None
    metric: str
    parameters: tuple[str, ...]
    early_terminate: bool

    @classmethod
    def read(cls, path: Path) -> SweepFile:
        spec = yaml.safe_load(Path(path).read_text())
        return cls(
            Path(path),
            str(spec["name"]),
            spec.get("project"),
            str(spec["metric"]["name"]),
            tuple(spec["parameters"]),
            "early_terminate" in spec,
        )

    @property
    def per_round(self) -> bool:
        """The metric is logged every round (hyperband reads it), not only in the summary."""
        return bool(PER_ROUND.fullmatch(self.metric))


def sweep_view(sweep: SweepFile, runs: RunFilter | None = None) -> View:
    """A sweep's view: parallel coordinates of the swept keys ending in the metric, parameter importance and, for a
    per-round metric, its curve by run. Shows the runs of group `name` (what `flsuite sweep` sets) unless `runs`."""
    panels: list[Panel] = [
        Parallel(f"{', '.join(sweep.parameters)} → {sweep.metric}", sweep.parameters, sweep.metric),
        Importance(sweep.metric),
    ]
    if sweep.per_round:
        panels.append(Curves(f"{sweep.metric} per {ROUND}", (sweep.metric,)))
    return View(
        f"flsuite sweep: {sweep.name}",
        runs or RunFilter(group=sweep.name),
        (Section(f"Sweep {sweep.name}", tuple(panels)),),
        by_method=False,
    )


@dataclass(frozen=True)
class StudyReport:
    """A study as a report: its comparison tables (Markdown), convergence and AVG panels over its runs, and the
    command that regenerates it."""

    title: str
    markdown: str
    command: str
    groups: tuple[str, ...]
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def study_report(title: str, markdown: str, command: str, groups: Sequence[str], prefix: str) -> StudyReport:
    """The report of a comparison: the runs of the W&B groups `groups` (the runs' `name`), grouped by method."""
    panels = (
        Curves(f"{ACC_MEAN} by method (mean ± std over seeds)", (ACC_MEAN,)),
        Bars(f"AVG ({prefix}{ACC_MEAN})", (prefix + ACC_MEAN,)),
    )
    return StudyReport(title, markdown, command, tuple(groups), panels)
