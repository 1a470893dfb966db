"""The comparison of labelled groups: its tables rendered as Markdown and as one self-contained HTML page, the
convergence PNG, and the report files."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from flsuite.compare.groups import check_one_experiment
from flsuite.compare.runs import load_run
from flsuite.compare.stats import (
    GroupStats,
    PairedDifference,
    group_stats,
    human_bytes,
    mean_pm,
    pair_key,
    paired_difference,
)
from flsuite.provenance import code_mix, cpu_mix
from flsuite.records import ACC_MEAN, ROUND, evaluated


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
    reference: str | None = None  # the group the paired differences are taken against (None: the first)

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
            rows.append(
                [
                    g.label,
                    *[mean_pm(g.acc.get(d, [])) for d in self.domains],
                    mean_pm(g.avg),
                    mean_pm(g.std),
                    mean_pm(g.std_sample),
                    g.seeds(),
                ]
            )
        return header, rows

    @property
    def reference_group(self) -> GroupStats:
        return next((g for g in self.groups if g.label == self.reference), self.groups[0])

    def paired(self, group: GroupStats) -> PairedDifference:
        """`group`'s AVG minus the reference group's, paired by seed (`pair_key`; a seed run twice: its mean)."""
        return paired_difference(_avg_by_pair(group), _avg_by_pair(self.reference_group))

    def paired_rows(self) -> tuple[list[str], list[list[str]]]:
        ref = self.reference_group
        header = ["method", f"Δ AVG vs {ref.label}", "SE", "95 % interval", "pairs", "verdict"]
        rows = []
        for g in self.groups:
            if g is not ref:
                d = self.paired(g)
                rows.append([g.label, *d.cells()[:3], str(d.n), d.cells()[3]])
        return header, rows

    def paired_note(self) -> str:
        return (
            f"Paired differences of AVG against {self.reference_group.label}, over the seeds both ran "
            "(a seed run twice counts once, its runs averaged): mean, SE = sample std of the differences / √pairs, "
            "95 % interval = mean ± t(0.975, pairs − 1) · SE; not resolved when the interval holds 0."
        )

    def code_warning(self) -> str:
        """A warning naming the code versions (commit, uncommitted changes) when the runs come from several."""
        return code_mix([r.code for g in self.groups for r in g.runs])

    def cpu_warning(self) -> str:
        """A warning naming the kinds of CPU (torch's CPU capability) when the runs were made on several."""
        return cpu_mix([r.cpu for g in self.groups for r in g.runs])

    def cost_rows(self) -> tuple[list[str], list[list[str]]]:
        targets = {g.target for g in self.groups if g.target is not None}
        target = f"rounds to {targets.pop():g}%" if len(targets) == 1 else "rounds to target"
        header = [
            "method",
            "last-k",
            target,
            "bytes up / round",
            "bytes down / round",
            "bytes up / run",
            "bytes down / run",
            "s / round",
        ]
        rows = []
        for g in self.groups:
            averaged = min(g.rounds_averaged)
            k = str(g.k) if averaged >= g.k else f"{g.k} (a run averaged only {averaged})"
            rows.append(
                [
                    g.label,
                    k,
                    _rounds_cell(g),
                    human_bytes(float(np.mean(g.bytes_up))) if g.bytes_up else "—",
                    human_bytes(float(np.mean(g.bytes_down))) if g.bytes_down else "—",
                    human_bytes(float(np.mean(g.run_bytes_up))),
                    human_bytes(float(np.mean(g.run_bytes_down))),
                    f"{np.mean(g.round_s):.2f}" if g.round_s else "—",
                ]
            )
        return header, rows

    def note(self) -> str:
        """What the accuracy table holds, with the number of rounds the runs actually averaged (their summaries'
        `last{k}/rounds`), which is fewer than `last_k` when the runs evaluated fewer rounds."""
        ks = sorted({g.k for g in self.groups})
        averaged = sorted({n for g in self.groups for n in g.rounds_averaged})
        if len(averaged) == 1:
            span = f"last {averaged[0]} evaluated round" + ("s" if averaged[0] != 1 else "")
            if ks != averaged:
                span += f" (last_k = {' or '.join(map(str, ks))}, but the runs evaluated only {averaged[0]})"
        else:
            span = f"last {averaged[0]} to {averaged[-1]} evaluated rounds (see the last-k column)"
        return (
            f"Top-1 accuracy (%) averaged over each run's {span}; mean ± std over seeds (population). "
            "AVG = mean over domains; STD = population std across domains of the last-k mean accuracies (GGEUR's "
            "convention); STD (n-1) = sample std (FKPL's)."
        )

    def remark(self) -> str:
        """A warning line when the groups (or the runs of one) differ in rounds run or in rounds averaged; else ""."""
        differ = []
        for what, values in (("rounds run", lambda g: g.rounds), ("rounds averaged", lambda g: g.rounds_averaged)):
            shown = {g.label: _span(values(g)) for g in self.groups}
            if len(set(shown.values())) > 1 or any("–" in v for v in shown.values()):
                differ.append(f"{what} ({', '.join(f'{label}: {v}' for label, v in shown.items())})")
        if not differ:
            return ""
        return f"Note: the runs differ in {' and in '.join(differ)}, so the numbers are not like for like."

    def markdown(self, title: str | None = None, png: str | None = None) -> str:
        lines = [f"## {title}", ""] if title else []
        lines += [self.note(), ""]
        for warning in (self.remark(), self.code_warning(), self.cpu_warning()):
            if warning:
                lines += [f"**{warning}**", ""]
        lines += [*_md_table(*self.accuracy_rows()), ""]
        if len(self.groups) > 1:
            lines += [self.paired_note(), "", *_md_table(*self.paired_rows()), ""]
        lines += [*_md_table(*self.cost_rows()), ""]
        if png:
            lines += [f"![convergence]({png})", ""]
        if self.skipped:
            lines += ["Skipped (unfinished, no summary.json): " + ", ".join(str(p) for p in self.skipped), ""]
        return "\n".join(lines)

    def html(self, title: str, png: bytes | None = None) -> str:
        """One self-contained page: both tables and the convergence PNG embedded as base64."""
        parts = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
            (
                "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
                "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
                "td:first-child,th:first-child{text-align:left}"
                "</style></head><body>"
            ),
            f"<h2>{html.escape(title)}</h2>",
            f"<p>{html.escape(self.note())}</p>",
            f"<p><strong>{html.escape(self.remark())}</strong></p>" if self.remark() else "",
            *(
                f"<p><strong>{html.escape(warning)}</strong></p>"
                for warning in (self.code_warning(), self.cpu_warning())
                if warning
            ),
            _html_table(*self.accuracy_rows()),
            *(
                [f"<p>{html.escape(self.paired_note())}</p>", _html_table(*self.paired_rows())]
                if len(self.groups) > 1
                else []
            ),
            _html_table(*self.cost_rows()),
        ]
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
            curves = [{int(r[ROUND]): float(r[ACC_MEAN]) for r in evaluated(run.history)} for run in g.runs]
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


def _avg_by_pair(g: GroupStats) -> dict[tuple, float]:
    """A group's AVG per pair key (`pair_key`), the mean of its runs with that key; runs without a seed are left out."""
    by_key: dict[tuple, list[float]] = {}
    for run, avg in zip(g.runs, g.avg):
        if (key := pair_key(run.config)) is not None:
            by_key.setdefault(key, []).append(avg)
    return {k: float(np.mean(v)) for k, v in by_key.items()}


def _span(values: Sequence[int | None]) -> str:
    """The runs' values: one number, `low–high`, or `?` where a run does not say."""
    known = sorted({v for v in values if v is not None})
    if not known:
        return "?"
    return str(known[0]) if len(known) == 1 else f"{known[0]}–{known[-1]}"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def compare(
    groups: Mapping[str, Sequence[Path]],
    target: float | None = None,
    skipped: Sequence[Path] = (),
    across_configs: bool = False,
    reference: str | None = None,
) -> Comparison:
    """Compare labelled groups of run folders (label -> run folders); groups with no finished run are left out.
    Each group must be seeds of one experiment (`check_one_experiment`) unless `across_configs` (`--by KEY`).
    `reference`: the label the paired differences are taken against (default: the first group)."""
    stats = []
    for label, paths in groups.items():
        runs = [load_run(p) for p in paths]
        if not across_configs:
            check_one_experiment(label, runs)
        if runs:
            stats.append(group_stats(label, runs, target))
    if not stats:
        raise FileNotFoundError("no finished runs to compare")
    if reference is not None and reference not in [g.label for g in stats]:
        raise ValueError(
            f"--reference {reference!r} is not a group of this comparison (groups: {', '.join(g.label for g in stats)})"
        )
    return Comparison(stats, list(skipped), reference)


def write_report(comparison: Comparison, out: Path, title: str) -> dict[str, Path]:
    """Write `compare.md`, `compare.html` (self-contained) and `convergence.png` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    png = out / "convergence.png"
    comparison.plot(png)
    files = {"markdown": out / "compare.md", "html": out / "compare.html", "png": png}
    files["markdown"].write_text(comparison.markdown(title, png=png.name))
    files["html"].write_text(comparison.html(title, png.read_bytes()))
    return files
