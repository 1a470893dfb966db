"""`flsuite compare RUNS...`: compare methods across finished runs (Markdown, a self-contained HTML page, one PNG).

    flsuite compare runs/my_study                      # a study folder: every run folder below it
    flsuite compare runs/fedavg/*-seed* runs/fedprox   # run folders, globs, or folders of runs
    flsuite compare runs/a runs/b                      # two runs side by side: one row per experiment
    flsuite compare runs/my_study --out reports/my_study --target 80

Decisions:
- A run folder is a folder holding `summary.json` (finished runs; unfinished ones are listed as skipped). By default
  runs are grouped by what they computed, never by where they sit: two runs are one group exactly when their resolved
  configs (`config.yaml`) are equal except for the seeds (`seed`, `data_seed`, `train_seed`: a grid of data and
  training seeds is one group) and the keys that only say how or where a run executed
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
  so summaries written before that became the summary's own arithmetic compare on the same footing. The header says
  how many rounds the runs actually averaged (`last{k}/rounds`: fewer than k when a run evaluated fewer), and a
  remark under it names the groups and their values when they differ in rounds run (the last round in metrics.jsonl)
  or in rounds averaged.
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
- Paired differences (with two or more groups): every group's AVG minus the reference group's (`--reference LABEL`,
  default the first row), over the seeds both ran (pairs: runs with the same data and training seeds,
  `flsuite.seeding.config_seeds`, and the same other `*_seed` keys; a seed pair run twice in a group counts once, its
  runs averaged): the mean, its standard error (sample std of the differences / √pairs) and the 95 % interval mean ±
  t(0.975, pairs − 1) · SE (Student's t, scipy); a difference whose interval holds 0 is marked "not resolved", and so is
  one with a single pair (no interval).
- Code versions: when the runs of the table come from more than one code version (environment.json `code`: the git
  commit and any uncommitted changes, `flsuite.provenance`), a warning under the header names each and how many runs
  it made; runs made before the code version was recorded count as "no commit recorded".
"""

from flsuite.compare.cli import main, parser
from flsuite.compare.groups import (
    EXECUTION_KEYS,
    check_one_experiment,
    config_value,
    differing_keys,
    experiment,
    group_by_config,
    group_by_experiment,
    group_by_parent,
    method_label,
)
from flsuite.compare.report import Comparison, compare, write_report
from flsuite.compare.runs import Run, find_runs, load_run, read_config
from flsuite.compare.stats import (
    GroupStats,
    PairedDifference,
    domain_std,
    first_round_reaching,
    group_stats,
    human_bytes,
    mean_pm,
    pair_key,
    paired_difference,
    round_prefixes,
    round_traffic,
    run_rounds,
    run_traffic,
)

# The modules: runs (finding and reading run folders), groups (grouping and the one-experiment check), stats (a
# group's numbers), report (the Comparison: Markdown, HTML, PNG, files), cli (the command line).
__all__ = [
    "EXECUTION_KEYS",
    "Comparison",
    "GroupStats",
    "PairedDifference",
    "Run",
    "check_one_experiment",
    "compare",
    "config_value",
    "differing_keys",
    "domain_std",
    "experiment",
    "find_runs",
    "first_round_reaching",
    "group_by_config",
    "group_by_experiment",
    "group_by_parent",
    "group_stats",
    "human_bytes",
    "load_run",
    "main",
    "mean_pm",
    "method_label",
    "pair_key",
    "paired_difference",
    "parser",
    "read_config",
    "round_prefixes",
    "round_traffic",
    "run_rounds",
    "run_traffic",
    "write_report",
]
