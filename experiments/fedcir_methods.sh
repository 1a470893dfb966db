#!/usr/bin/env bash
# FedCiR study 1 (issue 13): one client per domain on PACS or Office-Caltech-10 (CPU settings: frozen EfficientNet-Lite0
# features, MLP probabilistic encoder), FedAvg / FedProx / FedGen / FedProc / FedSR / FedCiR on the same network, per-domain
# accuracy, AVG, STD and rounds to the config's target accuracy. FedProc's α_t schedule is set for 50 rounds
# (configs/fedcir/with_fedproc_rounds50.yaml: the studies' --rounds 50).
#   bash experiments/fedcir_methods.sh pacs|office_caltech10 [--seeds 0 1 2] [--workers 1] [-- --rounds 100]
set -euo pipefail
cd "$(dirname "$0")/.."
dataset=${1:?usage: fedcir_methods.sh pacs|office_caltech10 [study.py flags]}; shift
exec python experiments/study.py --name "fedcir_$dataset" --base "configs/fedcir/effnet/$dataset.yaml" \
  --variant "FedAvg=" --variant "FedProx=configs/baselines/fedprox.yaml" --variant "FedGen=configs/baselines/fedgen.yaml" \
  --variant "FedProc=configs/baselines/fedproc.yaml,configs/fedcir/with_fedproc_rounds50.yaml" \
  --variant "FedSR=configs/baselines/fedsr.yaml" --variant "FedCiR=configs/fedcir/with_fedcir.yaml" \
  --seeds 0 1 2 --workers 1 --out "docs/results/fedcir_methods_$dataset.md" \
  --command "bash experiments/fedcir_methods.sh $dataset $*" "$@"
