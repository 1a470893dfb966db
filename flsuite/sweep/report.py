"""A sweep's outputs: trials.md and trials.csv (every trial, best first), best.yaml and optuna's plots."""

from __future__ import annotations

import csv
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flsuite.sweep.spec import SweepError

if TYPE_CHECKING:
    from flsuite.sweep.study import Sweep

log = logging.getLogger("flsuite.sweep")


def trial_rows(sweep: Sweep, study: Any) -> list[dict[str, Any]]:
    """One row per trial (state, value, parameters, rounds, seconds, folder, note): complete, then pruned, then the
    rest, each best first."""
    from optuna.trial import TrialState

    names = list(sweep.cfg["parameters"])
    sign = -1 if sweep.cfg["metric"]["goal"] == "maximize" else 1
    rows = []
    for t in study.get_trials(deepcopy=False):
        last_round = max(t.intermediate_values) if t.intermediate_values else None
        row = {
            "trial": t.number,
            "state": t.state.name,
            sweep.metric: t.value,
            **{n: t.params.get(n, sweep.cfg["parameters"][n].get("value")) for n in names},
            "rounds": last_round,
            "seconds": round(t.duration.total_seconds(), 1) if t.duration else None,
            "run_dir": t.user_attrs.get("run_dir", ""),
            "note": note(t),
        }
        rows.append(row)
    order = {TrialState.COMPLETE.name: 0, TrialState.PRUNED.name: 1}
    rows.sort(
        key=lambda r: (
            order.get(r["state"], 2),
            sign * r[sweep.metric] if r[sweep.metric] is not None else 0,
            r["trial"],
        )
    )
    return rows


def write_report(sweep: Sweep, study: Any) -> dict[str, Path]:
    """Write trials.md, trials.csv, best.yaml and the plots; return their paths."""
    from optuna.trial import TrialState

    rows = sweep.rows(study)
    files: dict[str, Path] = {"csv": sweep.out / "trials.csv", "markdown": sweep.out / "trials.md"}
    with open(files["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    lines = [
        f"## Sweep {sweep.name} ({sweep.file})",
        "",
        (
            f"{sweep.cfg['method']} search, metric `{sweep.metric}` ({sweep.cfg['metric']['goal']}), "
            f"{len(complete)} complete of {len(rows)} trials; study {sweep.out / 'study.db'}."
        ),
        "",
    ]
    if rows:
        header = list(rows[0])
        lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        lines += ["| " + " | ".join(fmt(r[h]) for h in header) + " |" for r in rows]
    if complete:
        best = study.best_trial
        files["best"] = sweep.out / "best.yaml"
        write_best_config(
            Path(best.user_attrs["run_dir"]) / "config.yaml", files["best"], best.number, sweep.metric, best.value
        )
        lines += [
            "",
            (
                f"Best: trial {best.number}, {sweep.metric} = {best.value:.4f}, parameters {best.params}; "
                f"rerun with `flsuite fit --config {files['best']}`."
            ),
        ]
        files.update(sweep.plots(study))
    (files["markdown"]).write_text("\n".join(lines) + "\n")
    return files


def plots(sweep: Sweep, study: Any) -> dict[str, Path]:
    """optuna's matplotlib figures: the metric against each parameter (slice), importance, parallel coordinates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    out = sweep.out / "plots"
    out.mkdir(exist_ok=True)
    files = {}
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    figures: dict[str, Callable[..., Any]] = {"slice": ovm.plot_slice, "importance": ovm.plot_param_importances}
    if len(sweep.cfg["parameters"]) > 1:  # with one parameter the slice plot already shows everything
        figures["parallel_coordinate"] = ovm.plot_parallel_coordinate
    for name, plot in figures.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = plot(study, target_name=sweep.metric)
        except Exception as err:  # noqa: BLE001 - e.g. importance needs >= 2 complete trials with varied parameters
            log.info("no %s plot: %s", name, err)
            continue
        first = axes.flat[0] if hasattr(axes, "flat") else axes
        fig = first.figure
        if name == "slice":  # one panel per parameter, plus optuna's colour bar
            fig.set_size_inches(3.5 * len(sweep.cfg["parameters"]) + 1.5, 4.0)
        files[name] = out / f"{name}.png"
        fig.savefig(files[name], dpi=100, bbox_inches="tight")
        plt.close(fig)
    return files


def note(trial: Any) -> str:
    parts = []
    if "retry_of" in trial.user_attrs:
        parts.append(f"retry of {trial.user_attrs['retry_of']}")
    if trial.user_attrs.get("interrupted"):
        parts.append("interrupted (sweep killed)")
    return "; ".join(parts)


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_best_config(config: Path, out: Path, number: int, metric: str, value: float) -> None:
    """The best trial's resolved config with run_dir cleared, so `flsuite fit --config best.yaml` makes a new run."""
    if not config.is_file():
        raise SweepError(f"best trial {number}: {config} does not exist")
    cfg = yaml.safe_load(config.read_text())
    if isinstance(cfg, dict) and "run_dir" in cfg:
        cfg["run_dir"] = None
    out.write_text(
        f"# Best trial {number} of the sweep ({metric} = {value:.4f}); from {config}\n"
        + yaml.safe_dump(cfg, sort_keys=False)
    )
