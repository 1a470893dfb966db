#!/usr/bin/env bash
# local.loop: compiled against the lean loop on a real study setting: GGEUR's digits_offline protocol (frozen
# EfficientNet-Lite0 features, FedAvg + GGEUR Steps 1 & 2, 4 clients x ~12,500 steps per round), the same seeds,
# through the study runner (experiments/study.py: finished runs are kept, the table is flsuite compare's):
# accuracy must agree within seed noise, time per round is the point.
#   bash benchmarks/compiled_loop_accuracy.sh [--seeds 0 1 2] [--workers 2] [-- --rounds 20]
set -euo pipefail
cd "$(dirname "$0")/.."
python experiments/study.py --name compiled_loop_ggeur --base configs/ggeur/effnet/digits_offline.yaml \
  --variant "lean=configs/ggeur/with_ggeur.yaml" --variant "compiled=configs/ggeur/with_ggeur.yaml,configs/examples/compiled_loop.yaml" \
  --out docs/results/compiled_loop.md --command "bash benchmarks/compiled_loop_accuracy.sh $*" "$@"
