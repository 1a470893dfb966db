#!/usr/bin/env bash
# FKPL's mixing bounds (a, b) on Office-Caltech-10 over 3 seeds, through the sweep file users run
# (sweeps/fkpl_mixing_bounds.yaml, offline with flsuite sweep; a finished sweep resumes as a no-op), at the reduced
# schedule of fkpl_reduced.sh office (20 rounds × 5 local epochs); then the trials of the three sweeps grouped by
# (a, b) into docs/results/fkpl_mixing_office_reduced.md.
#   bash experiments/fkpl_mixing_office_reduced.sh [seeds...]        (default 0 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("${@:-0 1 2}"); seeds=(${seeds[*]})
for s in "${seeds[@]}"; do
  flsuite sweep sweeps/fkpl_mixing_bounds.yaml --out "runs/sweeps/fkpl_mixing_bounds/seed$s" --workers 1 -- \
    --rounds=20 --local.epochs=5 --eval_every=5 --seed="$s" --wandb.enabled=false
done
out=runs/sweeps/fkpl_mixing_bounds/compare
flsuite compare $(printf 'runs/sweeps/fkpl_mixing_bounds/seed%s/trials ' "${seeds[@]}") \
  --by method.init_args.a method.init_args.b --out "$out"
{ sed -e "s/^## Method comparison/## FKPL mixing bounds (a, b) on Office-Caltech-10 (reduced CPU schedule, ${#seeds[@]} seeds)/" \
    -e '/convergence.png/d' "$out/compare.md"
  printf '\nRegenerate with:\n\n```bash\nbash experiments/fkpl_mixing_office_reduced.sh %s\n```\n' "${seeds[*]}"; } > docs/results/fkpl_mixing_office_reduced.md
