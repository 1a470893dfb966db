"""The optuna side of a sweep: the study in SQLite, and trials run as processes (samplers and pruners: samplers.py;
the line per finished trial: progress.py).

Only optuna's public API is used: the re-queue of interrupted trials goes through the storage this module creates (an
`optuna.storages.RDBStorage`, whose methods are the documented storage interface), finding trial ids by number.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flsuite.records import ROUND
from flsuite.sweep.progress import Progress
from flsuite.sweep.report import plots, trial_rows, write_report
from flsuite.sweep.samplers import suggest
from flsuite.sweep.spec import (
    SweepError,
    check_fit_args,
    expand_command,
    fit_args,
    grid_size,
    load_sweep,
    objective_value,
    per_round_key,
)

log = logging.getLogger("flsuite.sweep")


class TrialFailed(RuntimeError):
    """A trial's process exited with an error (its log says why)."""


class Sweep:
    """One sweep folder: the optuna study in SQLite, trial run folders, logs and reports."""

    def __init__(
        self, file: Path, out: Path, workers: int = 1, seed: int = 0, extra: Sequence[str] = (), poll_s: float = 0.5
    ) -> None:
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

        # The package's sampler_for and pruner_for, looked up when called, so that a caller (a test) may replace them.
        from flsuite import sweep as package

        direction = "maximize" if self.cfg["metric"]["goal"] == "maximize" else "minimize"
        # workers are threads of this process (each drives one trial process); a long SQLite timeout rides out their
        # writes
        self.storage = optuna.storages.RDBStorage(self.storage_url, engine_kwargs={"connect_args": {"timeout": 60}})
        # A resumed random/bayes sweep seeds its sampler past the trials it already has, so it does not replay them.
        # Grid keeps its seed: GridSampler shuffles the grid with it and records visited points by their index.
        existing = 0
        if self.cfg["method"] != "grid" and self.name in optuna.study.get_all_study_names(self.storage):
            existing = len(optuna.load_study(study_name=self.name, storage=self.storage).trials)
        return optuna.create_study(
            study_name=self.name,
            storage=self.storage,
            direction=direction,
            sampler=package.sampler_for(self.cfg, self.seed + existing, storage=self.storage),
            pruner=package.pruner_for(self.cfg),
            load_if_exists=True,
        )

    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if k not in ("WANDB_SWEEP_ID", "WANDB_RUN_ID", "WANDB_SWEEP_PARAM_PATH")
        }
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
                            trial.report(float(record[self.report_key]), step=int(record[ROUND]))
                            if not done and trial.should_prune():
                                stop(proc)
                                raise optuna.TrialPruned(f"pruned at round {record[ROUND]}")
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
        study_id = self.storage.get_study_id_from_name(study.study_name)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            self.storage.set_trial_user_attr(trial_id, "interrupted", True)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
            study.add_trial(
                optuna.trial.create_trial(
                    state=TrialState.WAITING,
                    params=t.params,
                    distributions=t.distributions,
                    user_attrs={"retry_of": t.number},
                    system_attrs={k: v for k, v in t.system_attrs.items() if k != "fixed_params"},
                )
            )
            requeued.append(t.number)
        return requeued

    def check_reuse(self, study: Any) -> int:
        """Stop (SweepError, naming each trial and why) when a finished trial, complete or pruned, is not the run this
        invocation would make for its parameters: same resolved config (the file's command, its parameters and the
        flags after `--`) and same code (`flsuite.provenance.same_experiment`), since resuming would mix them in
        one study. Trials of a command other than `flsuite fit`, whose folders hold no environment.json, are not
        checked. Returns how many trials were checked."""
        from optuna.trial import TrialState

        from flsuite.provenance import same_experiment

        checked, problems, parser = 0, [], None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            run_dir = Path(t.user_attrs.get("run_dir", ""))
            params = {n: t.params.get(n, spec.get("value")) for n, spec in self.cfg["parameters"].items()}
            args = fit_args(self.trial_command(params, run_dir))
            if args is None or not (run_dir / "environment.json").is_file():
                continue
            from flsuite.cli import resolved_config_yaml
            from flsuite.cli_parsers import fit_parser

            parser = parser or fit_parser()
            decision = same_experiment(run_dir, resolved_config_yaml(parser, check_fit_args(args, parser)))
            checked += 1
            if not decision.same:
                problems.append(f"trial {t.number} ({run_dir}): {decision.reason}")
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise SweepError(
                f"{self.out} holds {len(problems)} finished trial(s) that are not the runs this sweep would make now, "
                f"so resuming it would mix experiments in one study: {'; '.join(problems[:5])}{more}. "
                f"Run the sweep into another --out (or move {self.out} aside)"
            )
        return checked

    def run(self, trials: int | None = None) -> Any:
        import optuna
        from optuna.trial import TrialState

        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "sweep.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SweepError(
                    f"{self.out} is driven by another running `flsuite sweep` (lock file {self.out / 'sweep.lock'})"
                ) from None
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = self.study()
            if checked := self.check_reuse(study):
                from flsuite.provenance import code_label, code_version

                log.info(
                    "sweep %s: reusing %d finished trial(s): same config and code (%s)",
                    self.name,
                    checked,
                    code_label(code_version()),
                )
            requeued = self.requeue_interrupted(study)
            if requeued:
                log.warning("re-queued trial(s) %s that were running when the sweep stopped", requeued)
            target = (
                trials or self.cfg.get("run_cap") or (grid_size(self.cfg) if self.cfg["method"] == "grid" else None)
            )
            if target is None:
                raise SweepError(f"{self.file}: a {self.cfg['method']} sweep needs --trials (or run_cap in the file)")
            finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
            remaining = max(0, target - finished)
            log.info(
                "sweep %s: %d of %d trials finished; running %d more with %d worker(s)",
                self.name,
                finished,
                target,
                remaining,
                self.workers,
            )
            progress = Progress(self, target, finished)
            # Re-queued trials run first and one at a time: optuna's threads can pop the same waiting trial twice.
            waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            for n_trials, n_jobs in ((min(waiting, remaining), 1), (remaining - min(waiting, remaining), self.workers)):
                if n_trials:
                    study.optimize(
                        self.objective,
                        n_trials=n_trials,
                        n_jobs=n_jobs,
                        catch=(TrialFailed, SweepError),
                        gc_after_trial=False,
                        callbacks=[progress],
                    )
            self.report(study)
            if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
                raise SweepError(f"sweep {self.name}: no trial finished; see the logs in {self.out / 'logs'}")
        return study

    # ---- outputs (flsuite.sweep.report) ------------------------------------------------------------------------------
    def rows(self, study: Any) -> list[dict[str, Any]]:
        return trial_rows(self, study)

    def report(self, study: Any) -> dict[str, Path]:
        """Write trials.md, trials.csv, best.yaml and the plots; return their paths."""
        return write_report(self, study)

    def plots(self, study: Any) -> dict[str, Path]:
        """optuna's matplotlib figures: the metric against each parameter (slice), importance, parallel coordinates."""
        return plots(self, study)


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
