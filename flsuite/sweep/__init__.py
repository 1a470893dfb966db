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
- A resumed sweep reuses its finished trials only when each is the run this invocation would make for its parameters:
  the same resolved config (the file's command, the parameters, the flags after `--`) and the same code (package
  version, git commit, identical uncommitted changes; `flsuite.provenance.same_experiment`). Otherwise it stops before
  running anything, naming each such trial and why (the keys that differ, or the two code versions): a study's trials
  would mix experiments, and optuna cannot rerun a finished trial, so the sweep goes to another `--out`. Trials of a
  command other than `flsuite fit` (no environment.json in their folders) are not checked.
- Progress: one line on stderr per finished trial (trials done / target, the trial's parameters and score, the best
  so far, the time since the sweep started); each trial's own output goes to `<out>/logs/<n>.log`.
- Outputs in `<out>`: trials.md / trials.csv (every trial, best first), best.yaml (the best trial's resolved
  config.yaml with run_dir cleared: `flsuite fit --config best.yaml` reruns it), plots/slice.png (the metric against
  each parameter), plots/importance.png and (with ≥ 2 parameters) plots/parallel_coordinate.png (optuna's
  matplotlib figures).
"""

from flsuite.sweep.cli import main, parser
from flsuite.sweep.progress import Progress
from flsuite.sweep.report import (
    fmt,
    note,
    plots,
    trial_rows,
    write_best_config,
    write_report,
)
from flsuite.sweep.samplers import grid_sampler, pruner_for, same_grid, sampler_for, suggest
from flsuite.sweep.spec import (
    DISTRIBUTIONS,
    MACROS,
    METHODS,
    PER_ROUND,
    TOP_LEVEL_KEYS,
    SweepError,
    args_flags,
    check_fit_args,
    distribution,
    expand_command,
    fit_args,
    grid_size,
    load_sweep,
    objective_value,
    per_round_key,
)
from flsuite.sweep.study import Sweep, TrialFailed, read_new_records, stop

# The modules: spec (the W&B file -> a checked spec, the agent's command), samplers (optuna samplers, pruners, the
# trials' parameters), study (the study and the trials), progress (a line per finished trial), report (trials.md/csv,
# best.yaml, plots), cli (the command line).
__all__ = [
    "DISTRIBUTIONS",
    "MACROS",
    "METHODS",
    "PER_ROUND",
    "Progress",
    "TOP_LEVEL_KEYS",
    "Sweep",
    "SweepError",
    "TrialFailed",
    "args_flags",
    "check_fit_args",
    "distribution",
    "expand_command",
    "fit_args",
    "fmt",
    "grid_sampler",
    "grid_size",
    "load_sweep",
    "main",
    "note",
    "objective_value",
    "parser",
    "per_round_key",
    "plots",
    "pruner_for",
    "read_new_records",
    "same_grid",
    "sampler_for",
    "stop",
    "suggest",
    "trial_rows",
    "write_best_config",
    "write_report",
]
