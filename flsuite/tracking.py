"""Run outputs: the local run folder (always) and one W&B run per federation (offline when no API key is set).

Named `tracking` rather than `logging` so that it never shadows the standard library's module.

Run folder layout:
    config.yaml       resolved config (written by the CLI)      environment.json  seeds, versions, code, command line (+
    resumes) partition.json    samples per client per class               partition.png     its heat-map setup.json
    setup-stage metrics (e.g. GGEUR bytes) metrics.jsonl     one record per round (deterministic)       timings.jsonl
    wall time per round summary.json      final numbers                              results.md        per-domain table
    convergence.png   accuracy per round                         checkpoints/last.pt
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from flsuite.interrupts import RunInterrupted
from flsuite.plots import plot_convergence, plot_partition
from flsuite.records import ACC_PREFIX, LAST_PREFIX, ROUND, RoundTraffic, summary_prefix
from flsuite.run_environment import write_json

log = logging.getLogger(__name__)


@dataclass
class WandbConfig:
    """Weights & Biases logging.

    Args:
        enabled: Log to W&B at all (the local run folder is always written).
        mode: "auto" = online when an API key is configured (WANDB_API_KEY or `wandb login`), else offline;
            "online" and "offline" force it. The WANDB_MODE environment variable, when set, wins.
        project: W&B project.
        entity: W&B entity (team or user); null for the default.
        tags: Tags added to the run.
    """

    enabled: bool = True
    mode: Literal["auto", "online", "offline"] = "auto"
    project: str = "flsuite"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)


#: wandb.init's modes; WANDB_MODE may also hold its older spellings (e.g. `dryrun`), which wandb.init still takes.
WandbMode = Literal["online", "offline", "disabled", "shared"]


def _resolve_wandb_mode(mode: str) -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        has_key = netrc.is_file() and "api.wandb.ai" in netrc.read_text()
    except OSError:
        has_key = False
    return "online" if has_key else "offline"


def _offline_reason(mode: str) -> str:
    """Why a run logs offline, and what would make it online (flsuite's choice, not a W&B settings file)."""
    if os.environ.get("WANDB_MODE"):
        return f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if mode == "offline":
        return "wandb.mode=offline"
    return "no W&B API key; `wandb login` or WANDB_API_KEY makes runs online"


def _run_settings(mode: str):
    """This run's W&B settings: an offline run prints none of its own banner (`silent`, for this run only).

    W&B's offline banner says "W&B syncing is set to `offline` in this directory. Run `wandb online` ...", which is
    untrue here: flsuite passes the mode (from the API key, `wandb.mode` or WANDB_MODE), so `wandb online` changes
    nothing. flsuite says why the run is offline and how to upload it (`_say_how_to_sync`); W&B's warnings and errors
    (`wandb.termwarn`, e.g. a step logged out of order) still show.
    """
    import wandb

    return wandb.Settings(silent=True) if mode == "offline" else None


#: W&B exit codes: 0 = finished, 1 = failed (an error stopped the run), 255 = interrupted (Ctrl-C; W&B's own
#: convention for a KeyboardInterrupt). Any non-zero code shows the run as "failed" on the dashboard.
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 255


def run_labels(method: object, data: object, setup: Sequence[object] = ()) -> dict[str, str]:
    """What tells runs apart on a dashboard: the method's class name (joined with the setup stages', e.g.
    "FedAvg+GGEUR") and the dataset (a benchmark's `suite`, else the data source's class name)."""
    method_name = "+".join([type(method).__name__, *(type(stage).__name__ for stage in setup)])
    return {"method_name": method_name, "dataset": str(getattr(data, "suite", None) or type(data).__name__)}


def under_sweep_agent() -> bool:
    """A W&B sweep agent started this process: it chose the run (WANDB_SWEEP_ID / WANDB_RUN_ID), we join it."""
    return bool(os.environ.get("WANDB_SWEEP_ID") or os.environ.get("WANDB_RUN_ID"))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def wandb_scalars(record: Mapping[str, Any]) -> dict[str, float | int]:
    """A round record's numbers for W&B: scalars as they are, and mappings of numbers (e.g. per-client fit metrics
    `{"client_loss": {"3": 0.41}}`) as `client_loss/3`; lists (sampled clients) stay in metrics.jsonl only."""
    out: dict[str, float | int] = {}
    for key, value in record.items():
        if _is_number(value):
            out[key] = value
        elif isinstance(value, Mapping):
            out.update({f"{key}/{k}": v for k, v in value.items() if _is_number(v)})
    return out


def wandb_history(
    history: Sequence[Mapping[str, Any]], timings: Sequence[Mapping[str, Any]]
) -> list[dict[str, float | int]]:
    """What `Tracker.log_round` sends W&B for these records, one dict per record (a run folder replayed, e.g. to list
    the keys a run logs without W&B)."""
    traffic = RoundTraffic()
    return [wandb_scalars({**record, **timing, **traffic.add(record)}) for record, timing in zip(history, timings)]


class Tracker:
    """Writes the run folder and mirrors metrics to W&B (x-axis = round).

    A W&B run is finished as "finished" only through `finish` (the run completed); `close` without it marks the run
    failed (exit code 1), or interrupted (255) after Ctrl-C.
    """

    def __init__(
        self,
        run_dir: Path,
        wandb_cfg: WandbConfig,
        group: str,
        config: Mapping[str, Any],
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.wandb_run = None
        self.traffic = RoundTraffic()
        if wandb_cfg.enabled:
            self.wandb_run = self._init_wandb(wandb_cfg, group, config, dict(labels or {}))

    def _init_wandb(self, cfg: WandbConfig, group: str, config: Mapping[str, Any], labels: dict[str, str]):
        import wandb

        mode = _resolve_wandb_mode(cfg.mode)
        id_file = self.run_dir / "wandb_id.txt"
        tags = list(dict.fromkeys([*labels.values(), *cfg.tags]))
        kwargs: dict[str, Any] = dict(
            project=cfg.project,
            entity=cfg.entity,
            group=group,
            tags=tags,
            config={**dict(config), **labels},
            dir=str(self.run_dir),
            job_type=labels.get("method_name"),
        )
        if under_sweep_agent() and not id_file.is_file():
            # Join the agent's run (its id and name); forcing our own id would detach the run from the sweep.
            if os.environ.get("WANDB_RUN_ID"):
                kwargs["id"] = os.environ["WANDB_RUN_ID"]
        else:
            run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
            kwargs.update(id=run_id, resume="allow", name=self.run_dir.name)
        try:
            run = wandb.init(mode=cast(WandbMode, mode), settings=_run_settings(mode), **kwargs)
        except Exception as err:  # no network, bad key: keep the experiment going, offline
            if mode == "offline":
                raise
            log.warning("W&B online init failed (%s); logging offline instead", err)
            mode = "offline"
            run = wandb.init(mode=cast(WandbMode, mode), settings=_run_settings(mode), **kwargs)
        if mode == "offline":
            log.info("W&B logs offline (%s)", _offline_reason(cfg.mode))
        id_file.write_text(run.id)
        run.define_metric(ROUND)
        run.define_metric("*", step_metric=ROUND)
        return run

    # ---- per run ---------------------------------------------------------------------------------------------
    def log_partition(self, stats: Mapping[str, Any]) -> None:
        write_json(self.run_dir / "partition.json", stats)
        png = self.run_dir / "partition.png"
        plot_partition(stats, png)
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.log({"partition": wandb.Image(str(png)), ROUND: 0})

    def log_setup(self, metrics: Mapping[str, Any]) -> None:
        """Setup-stage metrics (e.g. GGEUR's bytes each way): `setup.json` and the W&B summary."""
        write_json(self.run_dir / "setup.json", dict(metrics))
        if self.wandb_run is not None:
            self.wandb_run.summary.update(dict(metrics))

    def add_setup(self, metrics: Mapping[str, Any]) -> None:
        """More run-level metrics (e.g. a phase's per-stage cost): merged into `setup.json` and the W&B summary."""
        path = self.run_dir / "setup.json"
        self.log_setup({**(json.loads(path.read_text()) if path.is_file() else {}), **metrics})

    def artifact(self, name: str) -> Path:
        """Where a phase writes a file of its own into the run folder (a figure, a table)."""
        return self.run_dir / name

    def log_round(self, record: Mapping[str, Any], timing: Mapping[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        with open(self.run_dir / "timings.jsonl", "a") as f:
            f.write(json.dumps(timing) + "\n")
        totals = self.traffic.add(record)
        if self.wandb_run is not None:
            self.wandb_run.log(wandb_scalars({**record, **timing, **totals}))

    def rewrite_history(self, history: Sequence[Mapping[str, Any]], timings: Sequence[Mapping[str, Any]]) -> None:
        """On resume: the files hold exactly the checkpointed rounds (a killed run may have logged more)."""
        (self.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
        (self.run_dir / "timings.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timings))
        self.traffic = RoundTraffic()
        for record in history:
            self.traffic.add(record)

    def finish(
        self, summary: Mapping[str, Any], table: str, history: Sequence[Mapping[str, Any]], domains: Sequence[str]
    ) -> None:
        write_json(self.run_dir / "summary.json", summary)
        (self.run_dir / "results.md").write_text(table + "\n")
        png = self.run_dir / "convergence.png"
        plot_convergence(history, domains, png)
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.summary.update({k: v for k, v in summary.items() if v is not None})
            try:
                prefix = summary_prefix(summary)  # last{k}/, k = last_k
            except KeyError:  # no evaluated round
                prefix = LAST_PREFIX
            rows = [
                [d, summary.get(f"{prefix}{ACC_PREFIX}{d}"), summary.get(f"{LAST_PREFIX}{ACC_PREFIX}{d}")]
                for d in domains
            ]
            columns: list[str | int] = ["domain", f"{prefix.rstrip('/')}_avg", "last"]
            final: dict[str, Any] = {"final_per_domain": wandb.Table(columns=columns, data=rows)}
            if png.is_file():
                final["convergence"] = wandb.Image(str(png))
            self.wandb_run.log(final)
            self._say_how_to_sync()
            self.wandb_run.finish(exit_code=EXIT_OK)
            self.wandb_run = None

    def _say_how_to_sync(self) -> None:
        """An offline W&B run tells the user where it is and the one command that uploads it."""
        if self.wandb_run is not None and self.wandb_run.offline:
            log.info("W&B logged offline; upload this run with: wandb sync %s", Path(self.wandb_run.dir).parent)

    def close(self, interrupted: bool | None = None) -> None:
        """End the W&B run if `finish` did not: as interrupted (exit code 255) or failed (1). Called from a `finally`,
        `interrupted=None` tells the two apart by the exception on its way out (Ctrl-C or anything else)."""
        if self.wandb_run is None:
            return
        if interrupted is None:
            interrupted = isinstance(sys.exc_info()[1], (KeyboardInterrupt, RunInterrupted))
        self._say_how_to_sync()
        self.wandb_run.finish(exit_code=EXIT_INTERRUPTED if interrupted else EXIT_FAILED)
        self.wandb_run = None
