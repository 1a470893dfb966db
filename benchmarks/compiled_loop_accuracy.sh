#!/usr/bin/env bash
# local.loop: compiled against the lean loop on a real study setting: GGEUR's digits_offline protocol (frozen
# EfficientNet-Lite0 features, FedAvg + GGEUR Steps 1 & 2, 4 clients x ~12,500 steps per round), the same seeds,
# one run per (loop, seed). The table (docs/results/compiled_loop/compare.md) groups the runs by local.loop: accuracy must
# agree within seed noise, time per round is the point.
#
#   bash benchmarks/compiled_loop_accuracy.sh                  # ROUNDS=20 SEEDS="0 1 2" by default
#   ROUNDS=50 SEEDS="0 1 2 3 4" bash benchmarks/compiled_loop_accuracy.sh
# Finished runs are kept and skipped; an unfinished run folder is removed and run again.
set -euo pipefail
ROUNDS=${ROUNDS:-20}
SEEDS=${SEEDS:-"0 1 2"}
OUT=${OUT:-runs/compiled_loop}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true RAY_USAGE_STATS_ENABLED=0
for seed in $SEEDS; do
  for loop in lean compiled; do
    dir=$OUT/$loop/seed$seed
    if [ -f "$dir/summary.json" ]; then continue; fi
    rm -rf "$dir"
    flsuite fit --config configs/ggeur/effnet/digits_offline.yaml --config configs/ggeur/with_ggeur.yaml \
      --rounds "$ROUNDS" --seed "$seed" --local.loop "$loop" --wandb.enabled false --progress false --run_dir "$dir"
  done
done
flsuite compare "$OUT/lean" "$OUT/compiled" --by local.loop --title "local.loop: lean vs compiled (GGEUR digits_offline, $ROUNDS rounds)" \
  --out docs/results/compiled_loop
