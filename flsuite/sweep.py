"""`flsuite sweep sweeps/<file>.yaml`: run a W&B sweep file with no W&B server, on optuna.

    flsuite sweep sweeps/fedprox_mu.yaml --workers 2                    # grid: every point once
    flsuite sweep sweeps/moon.yaml --trials 20 --workers 2 -- --rounds=10  # extra `flsuite fit` flags after --

Decisions (the same file runs unchanged under `wandb sweep` + `wandb agent`):
- `method`: grid -> optuna GridSampler (its points handed out under a lock, so parallel workers never share one),
  random -> RandomSampler, bayes -> TPESampler (W&B's bayes is a Gaussian process; TPE is optuna's standard
  model-based sampler), all seeded by `--seed`.
- `parameters`: `values` (categorical / grid), `value` (constant), `min`/`max` with `distribution` uniform,
  int_uniform (the default when both bounds are ints), log_uniform_values or q_uniform. Other W&B distributions,
  nested parameters and null values (W&B renders null as the string "None", which no flsuite option parses) are
  rejected with an error naming the parameter.
- `early_terminate: {type: hyperband, min_iter, max_iter, eta}` -> optuna HyperbandPruner(min_resource=min_iter,
  max_resource=max_iter or "auto", reduction_factor=eta). Trials report the per-round value (the metric itself when
  it is a per-round key such as `acc_mean`, else the per-round key it averages, e.g. `last5/acc_mean` -> `acc_mean`)
  read from the trial's metrics.jsonl while it grows; a pruned trial's process is stopped.
- The objective is `metric.name` from the trial's summary.json, or for a per-round key its last round's value
  (`last/<key>`, which is what W&B's run summary holds for a logged key).
- Each trial runs the file's `command` as W&B's agent would (`${args}` -> `--key=value`, `${interpreter}` -> this
  Python, a leading `flsuite` -> `python -m flsuite.cli`) plus `--run_dir=<sweep>/trials/<n> --name=<sweep>
  --wandb.tags+=sweep --progress=false` and any flags after `--`, in its own process (OMP_NUM_THREADS=1,
  WANDB_MODE=offline unless set). `--workers` trials run at once. Every trial is a normal run folder.
- The study lives in `<out>/study.db` (SQLite). Re-running the same command resumes it: finished trials are kept,
  trials that were running when the sweep was killed are marked failed and re-queued with the same parameters (a
  grid trial with its grid point) to run first, in new folders, and the sweep runs until `--trials` trials have
  finished (default: `run_cap`, or the grid's size). A lock file stops two sweeps from driving one folder at once.
- Outputs in `<out>`: trials.md / trials.csv (every trial, best first), best.yaml (the best trial's resolved
  config.yaml with run_dir cleared: `flsuite fit --config best.yaml` reruns it), plots/slice.png (the metric against
  each parameter), plots/importance.png and (with ≥ 2 parameters) plots/parallel_coordinate.png (optuna's
  matplotlib figures).
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("flsuite.sweep")

METHODS = ("grid", "random", "bayes")
TOP_LEVEL_KEYS = {"program", "command", "method", "metric", "parameters", "early_terminate", "name", "description",
                  "project", "entity", "run_cap", "controller"}
DISTRIBUTIONS = ("uniform", "int_uniform", "log_uniform_values", "q_uniform", "categorical", "constant")
MACROS = ("${env}", "${interpreter}", "${program}", "${args}", "${args_no_hyphens}")
#: Keys logged once per round (metrics.jsonl); every other metric name is looked up in summary.json.
PER_ROUND = re.compile(r"acc/.+|acc_mean|acc_std|acc_std_sample|train_loss")


class SweepError(ValueError):
    """A sweep file that flsuite (or W&B) cannot run; the message names the file and key."""


class TrialFailed(RuntimeError):
    """A trial's process exited with an error (its log says why)."""


# ---- the sweep file ------------------------------------------------------------------------------------------------
def load_sweep(path: Path) -> dict[str, Any]:
    """Read and check a W&B sweep file (structure, methods, distributions, metric, command); return it."""
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(cfg, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with method, metric, parameters and command")
    unknown = set(cfg) - TOP_LEVEL_KEYS
    if unknown:
        raise SweepError(f"{path}: unknown top-level key(s) {sorted(unknown)}; W&B sweep keys are {sorted(TOP_LEVEL_KEYS)}")
    if cfg.get("method") not in METHODS:
        raise SweepError(f"{path}: method must be one of {METHODS}, got {cfg.get('method')!r}")
    metric = cfg.get("metric")
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str) or metric.get("goal") not in ("maximize", "minimize"):
        raise SweepError(f"{path}: metric must be {{name: <a key flsuite logs>, goal: maximize|minimize}}, got {metric!r}")
    params = cfg.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError(f"{path}: parameters must be a non-empty mapping of option name -> spec")
    for name, spec in params.items():
        distribution(name, spec, path)
        if cfg["method"] == "grid" and "values" not in spec and "value" not in spec:
            raise SweepError(f"{path}: parameter {name!r}: a grid sweep needs `values` (or `value`) for every parameter")
    command = cfg.get("command", ["${env}", "${interpreter}", "${program}", "${args}"])
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        raise SweepError(f"{path}: command must be a list of strings")
    if "${args}" not in command and "${args_no_hyphens}" not in command:
        raise SweepError(f"{path}: command must contain ${{args}} (where the agent puts --key=value)")
    if "${program}" in command and not cfg.get("program"):
        raise SweepError(f"{path}: command uses ${{program}} but the file has no program")
    early = cfg.get("early_terminate")
    if early is not None:
        if not isinstance(early, dict) or early.get("type") != "hyperband":
            raise SweepError(f"{path}: early_terminate must be {{type: hyperband, min_iter: ..., eta: ...}}, got {early!r}")
        bad = {k: v for k, v in early.items() if k != "type" and not (isinstance(v, int) and v >= 1)}
        if bad or ("min_iter" not in early and "max_iter" not in early):
            raise SweepError(f"{path}: early_terminate hyperband needs min_iter or max_iter, all positive integers, got {early!r}")
    if "run_cap" in cfg and not (isinstance(cfg["run_cap"], int) and cfg["run_cap"] >= 1):
        raise SweepError(f"{path}: run_cap must be a positive integer")
    return cfg


def distribution(name: str, spec: Any, path: Path | str = "sweep") -> str:
    """The W&B distribution of one parameter spec (checked), one of DISTRIBUTIONS."""
    where = f"{path}: parameter {name!r}"
    if not isinstance(spec, dict):
        raise SweepError(f"{where}: a spec is a mapping (values / value / min+max), got {spec!r}")
    if "parameters" in spec:
        raise SweepError(f"{where}: nested parameters are not supported; name the option with dots instead (e.g. method.init_args.mu)")
    if "probabilities" in spec:
        raise SweepError(f"{where}: `probabilities` is not supported by flsuite sweep")
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: values must be a non-empty list")
        if any(v is None or isinstance(v, (dict, list)) for v in values):
            raise SweepError(f"{where}: values must be scalars (W&B renders null as 'None', which flsuite does not parse; use the string 'null')")
        return "categorical"
    if "value" in spec:
        if spec["value"] is None or isinstance(spec["value"], (dict, list)):
            raise SweepError(f"{where}: value must be a scalar (use the string 'null' for None)")
        return "constant"
    if "min" not in spec or "max" not in spec:
        raise SweepError(f"{where}: give values, value, or min and max")
    lo, hi = spec["min"], spec["max"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi)) or lo >= hi:
        raise SweepError(f"{where}: min and max must be numbers with min < max, got {lo!r}, {hi!r}")
    default = "int_uniform" if isinstance(lo, int) and isinstance(hi, int) else "uniform"
    dist = spec.get("distribution", default)
    if dist not in ("uniform", "int_uniform", "log_uniform_values", "q_uniform"):
        raise SweepError(f"{where}: distribution {dist!r} is not supported; use one of uniform, int_uniform, log_uniform_values, q_uniform")
    if dist == "log_uniform_values" and lo <= 0:
        raise SweepError(f"{where}: log_uniform_values needs min > 0")
    if dist == "int_uniform" and not (isinstance(lo, int) and isinstance(hi, int)):
        raise SweepError(f"{where}: int_uniform needs integer min and max")
    return dist


def grid_size(cfg: Mapping[str, Any]) -> int:
    return math.prod(len(s["values"]) for s in cfg["parameters"].values() if "values" in s)


def args_flags(params: Mapping[str, Any], hyphens: bool = True) -> list[str]:
    """`--key=value` as W&B's agent renders `${args}` (Python's str() of each value), or `key=value`."""
    return [f"{'--' if hyphens else ''}{k}={v}" for k, v in params.items()]


def expand_command(cfg: Mapping[str, Any], params: Mapping[str, Any], interpreter: str = sys.executable) -> list[str]:
    """The command a W&B agent would run for `params`, with `${env}` dropped (the environment is passed instead),
    `${interpreter}` = this Python and a leading `flsuite` run as `python -m flsuite.cli` (the same interpreter)."""
    out: list[str] = []
    for token in map(str, cfg.get("command", ["${env}", "${interpreter}", "${program}", "${args}"])):
        if token == "${env}":
            continue
        if token == "${interpreter}":
            out.append(interpreter)
        elif token == "${program}":
            out.append(str(cfg["program"]))
        elif token == "${args}":
            out += args_flags(params)
        elif token == "${args_no_hyphens}":
            out += args_flags(params, hyphens=False)
        elif token.startswith("${"):
            raise SweepError(f"command macro {token} is not supported by flsuite sweep (use {', '.join(MACROS)})")
        else:
            out.append(token)
    if out and out[0] == "flsuite":
        out = [interpreter, "-m", "flsuite.cli", *out[1:]]
    return out


def fit_args(command: Sequence[str]) -> list[str] | None:
    """The arguments after `fit` when `command` runs `flsuite fit` (else None)."""
    for i, token in enumerate(command[:-1]):
        if token in ("flsuite.cli", "flsuite") and command[i + 1] == "fit":
            return list(command[i + 2 :])
        if token.endswith("flsuite/cli.py") and command[i + 1] == "fit":
            return list(command[i + 2 :])
    return None


def check_fit_args(args: Sequence[str], parser: Any = None) -> Any:
    """Parse `flsuite fit` arguments (what `--print_config` resolves); raise SweepError naming the bad key."""
    from flsuite.cli import fit_parser

    parser = parser or fit_parser()
    try:
        return parser.parse_args(list(args))
    except SystemExit as err:  # jsonargparse exits on some errors even with exit_on_error=False
        raise SweepError(f"flsuite fit {' '.join(args)}: invalid arguments (exit {err.code})") from None
    except Exception as err:  # noqa: BLE001 - reported with the arguments that caused it
        raise SweepError(f"flsuite fit {' '.join(args)}: {' '.join(str(err).split())}") from None


def per_round_key(metric: str) -> str:
    """The per-round key whose values stand in for `metric` while a trial runs (for hyperband)."""
    if PER_ROUND.fullmatch(metric):
        return metric
    tail = metric.split("/", 1)[1] if re.match(r"(last\d*|best)/", metric) else metric
    return tail if PER_ROUND.fullmatch(tail) else "acc_mean"


def objective_value(summary: Mapping[str, Any], metric: str, where: Path) -> float:
    """`metric` from a trial's summary.json (a per-round key: its last round's value, as W&B's summary holds)."""
    for key in (metric, f"last/{metric}"):
        if summary.get(key) is not None:
            return float(summary[key])
    raise SweepError(f"{where}: metric {metric!r} is not in the run's summary (keys: {', '.join(sorted(summary))})")


# ---- optuna ----------------------------------------------------------------------------------------------------------
def grid_sampler(space: Mapping[str, Sequence[Any]], seed: int):
    """optuna's GridSampler, with grid points handed out one at a time under a lock.

    GridSampler gives trial n < grid size the point n and picks later trials' points at random among those not yet
    taken; with `--workers 2` a trial created before its neighbour had its point could draw the same one (measured:
    0.1 twice, 0.2 never, in 2 of 5 runs). Here a new trial takes the first point (in the seeded shuffled order) that
    no trial holds, read and written under one lock; `flsuite sweep`'s lock file keeps a study to one process."""
    import threading

    import optuna
    from optuna.trial import TrialState

    class LockedGridSampler(optuna.samplers.GridSampler):
        _lock = threading.Lock()

        def before_trial(self, study, trial):
            if "grid_id" in trial.system_attrs or "fixed_params" in trial.system_attrs:
                return  # a re-queued trial keeps its point
            with self._lock:
                held = {t.system_attrs["grid_id"] for t in study._storage.get_all_trials(study._study_id, deepcopy=False)
                        if "grid_id" in t.system_attrs and self._same_search_space(t.system_attrs["search_space"])
                        and (t.state != TrialState.FAIL or not t.user_attrs.get("interrupted"))}
                free = [g for g in range(len(self._all_grids)) if g not in held]
                if not free:  # every point done or running: optuna's behaviour (re-evaluate one, then stop)
                    return super().before_trial(study, trial)
                study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._search_space)
                study._storage.set_trial_system_attr(trial._trial_id, "grid_id", free[0])

    return LockedGridSampler(dict(space), seed=seed)


def sampler_for(cfg: Mapping[str, Any], seed: int):
    import optuna

    if cfg["method"] == "grid":
        return grid_sampler({k: s["values"] for k, s in cfg["parameters"].items() if "values" in s}, seed)
    if cfg["method"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner_for(cfg: Mapping[str, Any]):
    import optuna

    early = cfg.get("early_terminate")
    if not early:
        return optuna.pruners.NopPruner()
    return optuna.pruners.HyperbandPruner(min_resource=early.get("min_iter", 1), max_resource=early.get("max_iter", "auto"),
                                          reduction_factor=early.get("eta", 3))


def suggest(trial: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """One trial's parameter values, in the file's order (constants included)."""
    params = {}
    for name, spec in cfg["parameters"].items():
        dist = distribution(name, spec)
        if dist == "constant":
            params[name] = spec["value"]
        elif dist == "categorical":
            params[name] = trial.suggest_categorical(name, spec["values"])
        elif dist == "int_uniform":
            params[name] = trial.suggest_int(name, spec["min"], spec["max"])
        elif dist == "q_uniform":
            params[name] = trial.suggest_float(name, spec["min"], spec["max"], step=spec.get("q", 1.0))
        else:
            params[name] = trial.suggest_float(name, spec["min"], spec["max"], log=dist == "log_uniform_values")
    return params


class Sweep:
    """One sweep folder: the optuna study in SQLite, trial run folders, logs and reports."""

    def __init__(self, file: Path, out: Path, workers: int = 1, seed: int = 0, extra: Sequence[str] = (), poll_s: float = 0.5) -> None:
        self.file, self.cfg = Path(file), load_sweep(file)
        self.name = str(self.cfg.get("name") or self.file.stem)
        self.out, self.workers, self.seed, self.extra, self.poll_s = Path(out), workers, seed, list(extra), poll_s
        self.metric = self.cfg["metric"]["name"]
        self.report_key = per_round_key(self.metric)

    @property
    def storage_url(self) -> str:
        return f"sqlite:///{(self.out / 'study.db').resolve()}"

    def study(self):
        import optuna

        direction = "maximize" if self.cfg["metric"]["goal"] == "maximize" else "minimize"
        # workers are threads of this process (each drives one trial process); a long SQLite timeout rides out their writes
        self.storage = optuna.storages.RDBStorage(self.storage_url, engine_kwargs={"connect_args": {"timeout": 60}})
        # A resumed random/bayes sweep seeds its sampler past the trials it already has, so it does not replay them.
        # Grid keeps its seed: GridSampler shuffles the grid with it and records visited points by their index.
        existing = 0
        if self.cfg["method"] != "grid" and self.name in optuna.study.get_all_study_names(self.storage):
            existing = len(optuna.load_study(study_name=self.name, storage=self.storage).trials)
        return optuna.create_study(study_name=self.name, storage=self.storage, direction=direction,
                                   sampler=sampler_for(self.cfg, self.seed + existing), pruner=pruner_for(self.cfg), load_if_exists=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SWEEP_ID", "WANDB_RUN_ID", "WANDB_SWEEP_PARAM_PATH")}
        env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        env.setdefault("WANDB_MODE", "offline")
        return env

    def trial_command(self, params: Mapping[str, Any], run_dir: Path) -> list[str]:
        command = expand_command(self.cfg, params)
        own = [f"--run_dir={run_dir}", f"--name={self.name}", "--wandb.tags+=sweep", "--progress=false"]
        return command + (own if fit_args(command) is not None else []) + self.extra

    def objective(self, trial: Any) -> float:
        import optuna

        params = suggest(trial, self.cfg)
        run_dir = self.out / "trials" / f"{trial.number:04d}"
        log_file = self.out / "logs" / f"{trial.number:04d}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        trial.set_user_attr("run_dir", str(run_dir))
        command = self.trial_command(params, run_dir)
        trial.set_user_attr("command", command)
        with open(log_file, "w") as logf:
            proc = subprocess.Popen(command, stdout=logf, stderr=subprocess.STDOUT, env=self.env())
            seen = 0
            try:
                while True:
                    done = proc.poll() is not None
                    for record in read_new_records(run_dir / "metrics.jsonl", seen):
                        seen += 1
                        if self.report_key in record:
                            trial.report(float(record[self.report_key]), step=int(record["round"]))
                            if not done and trial.should_prune():
                                stop(proc)
                                raise optuna.TrialPruned(f"pruned at round {record['round']}")
                    if done:
                        break
                    time.sleep(self.poll_s)
            except BaseException:
                stop(proc)
                raise
        if proc.returncode != 0:
            raise TrialFailed(f"trial {trial.number} exited with status {proc.returncode}; see {log_file}")
        summary_file = run_dir / "summary.json"
        if not summary_file.is_file():
            raise TrialFailed(f"trial {trial.number} wrote no {summary_file}; see {log_file}")
        return objective_value(json.loads(summary_file.read_text()), self.metric, summary_file)

    def requeue_interrupted(self, study: Any) -> list[int]:
        """Trials left RUNNING by a killed sweep: mark them failed and queue them again, as optuna's
        RetryFailedTrialCallback does: the parameters sampled so far and the system attributes (a grid trial's
        grid_id, so GridSampler reruns the same point even when the kill came before any parameter was sampled)."""
        import optuna
        from optuna.trial import TrialState

        requeued = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            study.add_trial(optuna.trial.create_trial(
                state=TrialState.WAITING, params=t.params, distributions=t.distributions, user_attrs={"retry_of": t.number},
                system_attrs={k: v for k, v in t.system_attrs.items() if k != "fixed_params"},
            ))
            requeued.append(t.number)
        return requeued

    def run(self, trials: int | None = None) -> Any:
        import optuna
        from optuna.trial import TrialState

        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "sweep.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SweepError(f"{self.out} is driven by another running `flsuite sweep` (lock file {self.out / 'sweep.lock'})") from None
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = self.study()
            requeued = self.requeue_interrupted(study)
            if requeued:
                log.warning("re-queued trial(s) %s that were running when the sweep stopped", requeued)
            target = trials or self.cfg.get("run_cap") or (grid_size(self.cfg) if self.cfg["method"] == "grid" else None)
            if target is None:
                raise SweepError(f"{self.file}: a {self.cfg['method']} sweep needs --trials (or run_cap in the file)")
            finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
            remaining = max(0, target - finished)
            log.info("sweep %s: %d of %d trials finished; running %d more with %d worker(s)", self.name, finished, target, remaining, self.workers)
            # Re-queued trials run first and one at a time: optuna's threads can pop the same waiting trial twice.
            waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            for n_trials, n_jobs in ((min(waiting, remaining), 1), (remaining - min(waiting, remaining), self.workers)):
                if n_trials:
                    study.optimize(self.objective, n_trials=n_trials, n_jobs=n_jobs, catch=(TrialFailed, SweepError), gc_after_trial=False)
            self.report(study)
            if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
                raise SweepError(f"sweep {self.name}: no trial finished; see the logs in {self.out / 'logs'}")
        return study

    # ---- outputs ---------------------------------------------------------------------------------------------------
    def rows(self, study: Any) -> list[dict[str, Any]]:
        from optuna.trial import TrialState

        names = list(self.cfg["parameters"])
        sign = -1 if self.cfg["metric"]["goal"] == "maximize" else 1
        rows = []
        for t in study.get_trials(deepcopy=False):
            last_round = max(t.intermediate_values) if t.intermediate_values else None
            row = {"trial": t.number, "state": t.state.name, self.metric: t.value, **{n: t.params.get(n, self.cfg["parameters"][n].get("value")) for n in names},
                   "rounds": last_round, "seconds": round(t.duration.total_seconds(), 1) if t.duration else None,
                   "run_dir": t.user_attrs.get("run_dir", ""), "note": note(t)}
            rows.append(row)
        order = {TrialState.COMPLETE.name: 0, TrialState.PRUNED.name: 1}
        rows.sort(key=lambda r: (order.get(r["state"], 2), sign * r[self.metric] if r[self.metric] is not None else 0, r["trial"]))
        return rows

    def report(self, study: Any) -> dict[str, Path]:
        """Write trials.md, trials.csv, best.yaml and the plots; return their paths."""
        from optuna.trial import TrialState

        rows = self.rows(study)
        files: dict[str, Path] = {"csv": self.out / "trials.csv", "markdown": self.out / "trials.md"}
        with open(files["csv"], "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
            writer.writeheader()
            writer.writerows(rows)
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        lines = [f"## Sweep {self.name} ({self.file})", "",
                 f"{self.cfg['method']} search, metric `{self.metric}` ({self.cfg['metric']['goal']}), "
                 f"{len(complete)} complete of {len(rows)} trials; study {self.out / 'study.db'}.", ""]
        if rows:
            header = list(rows[0])
            lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
            lines += ["| " + " | ".join(fmt(r[h]) for h in header) + " |" for r in rows]
        if complete:
            best = study.best_trial
            files["best"] = self.out / "best.yaml"
            write_best_config(Path(best.user_attrs["run_dir"]) / "config.yaml", files["best"], best.number, self.metric, best.value)
            lines += ["", f"Best: trial {best.number}, {self.metric} = {best.value:.4f}, parameters {best.params}; "
                          f"rerun with `flsuite fit --config {files['best']}`."]
            files.update(self.plots(study))
        (files["markdown"]).write_text("\n".join(lines) + "\n")
        return files

    def plots(self, study: Any) -> dict[str, Path]:
        """optuna's matplotlib figures: the metric against each parameter (slice), importance, parallel coordinates."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import optuna.visualization.matplotlib as ovm

        out = self.out / "plots"
        out.mkdir(exist_ok=True)
        files = {}
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        figures = {"slice": ovm.plot_slice, "importance": ovm.plot_param_importances}
        if len(self.cfg["parameters"]) > 1:  # with one parameter the slice plot already shows everything
            figures["parallel_coordinate"] = ovm.plot_parallel_coordinate
        for name, plot in figures.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    axes = plot(study, target_name=self.metric)
            except Exception as err:  # noqa: BLE001 - e.g. importance needs >= 2 complete trials with varied parameters
                log.info("no %s plot: %s", name, err)
                continue
            first = axes.flat[0] if hasattr(axes, "flat") else axes
            fig = first.figure
            if name == "slice":  # one panel per parameter, plus optuna's colour bar
                fig.set_size_inches(3.5 * len(self.cfg["parameters"]) + 1.5, 4.0)
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


def read_new_records(path: Path, seen: int) -> list[dict[str, Any]]:
    """Complete JSON lines of a growing metrics.jsonl after the first `seen`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the part after the last newline may be half-written
    return [json.loads(line) for line in lines[seen:] if line.strip()]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_best_config(config: Path, out: Path, number: int, metric: str, value: float) -> None:
    """The best trial's resolved config with run_dir cleared, so `flsuite fit --config best.yaml` makes a new run."""
    if not config.is_file():
        raise SweepError(f"best trial {number}: {config} does not exist")
    cfg = yaml.safe_load(config.read_text())
    if isinstance(cfg, dict) and "run_dir" in cfg:
        cfg["run_dir"] = None
    out.write_text(f"# Best trial {number} of the sweep ({metric} = {value:.4f}); from {config}\n"
                   + yaml.safe_dump(cfg, sort_keys=False))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flsuite sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, help="a W&B sweep file (sweeps/*.yaml)")
    ap.add_argument("--out", type=Path, help="sweep folder (default runs/sweeps/<file name>)")
    ap.add_argument("--trials", type=int, help="finished trials to reach (default: the file's run_cap, or the grid's size)")
    ap.add_argument("--workers", type=int, default=1, help="trials run at once, each in its own process (1)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed (0)")
    ap.epilog = "Flags after `--` are added to every trial's command (e.g. -- --rounds=10 --wandb.enabled=false)."
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser().parse_args(argv[:split]), argv[split + 1 :]
    out = args.out or Path("runs") / "sweeps" / args.file.stem
    if args.workers < 1:
        raise SweepError("--workers must be >= 1")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise SweepError("flsuite sweep needs optuna: pip install 'flsuite[sweep]' (or pip install optuna)") from None
    sweep = Sweep(args.file, out, workers=args.workers, seed=args.seed, extra=extra)
    sweep.run(args.trials)
    print((out / "trials.md").read_text())
    return 0

