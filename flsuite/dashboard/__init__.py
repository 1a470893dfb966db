"""`flsuite dashboard`: the W&B workspace that compares methods, built by code (the optional extra
`pip install "flsuite[dashboard]"`, W&B's `wandb-workspaces`, pinned).

    flsuite dashboard --project P [--entity E] [--group G | --tag T] [--dry-run OUT.json]
    flsuite dashboard --project P --group my_study --runs runs/my_study --dry-run view.json   # keys from run folders
    flsuite dashboard --sweep sweeps/fedprox_mu.yaml [--sweep-id ID]                          # a sweep's view

The view has sections for the headline numbers (last-k AVG and STD by method: bars and a scalar), convergence
(`acc_mean`, the STDs and every `acc/<domain>` against `round`), communication (bytes per round and so far), time
per round, and each method's own diagnostics where runs logged them (FedEGG's update ratio and guided rounds,
FedCiR's loss shares, FKPL's stage costs). Runs are grouped by method (`job_type`): the mean over seeds, ± std.

Decisions:
- The keys shown are the ones the runs logged: read from `--runs` folders, else asked of the W&B API; a dry run
  without `--runs` shows every declared panel (no network). Every key comes from `flsuite.records`.
- `--dry-run` writes the spec (the library's own model as JSON) and needs no network; without it the view is saved
  to the project and its URL printed. Without the extra installed the command stops first, naming it.
- A sweep's view (`--sweep FILE`) shows the swept keys against the sweep's metric (parallel coordinates, parameter
  importance, and the metric per round when hyperband reads it), over the runs of group `name` (what
  `flsuite sweep` sets) or of `--sweep-id` (a `wandb agent` sweep).
- `flsuite compare ... --wandb-report` publishes a comparison as a report (`flsuite.dashboard.publish`).
"""

from flsuite.dashboard.cli import main, parser

__all__ = ["main", "parser"]
