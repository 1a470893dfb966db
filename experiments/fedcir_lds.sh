#!/usr/bin/env bash
# FedCiR study 3 (issue 13): PACS with label + feature skew (Dirichlet β = 0.5 inside each domain, 5 clients per
# domain; CPU settings), FedAvg / FedProx / FedGen / FedSR / FedCiR on the same network.
#   bash experiments/fedcir_lds.sh [--seeds 0 1 2] [--workers 1] [-- --rounds 100]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python experiments/study.py --name fedcir_lds_pacs --base configs/fedcir/effnet/pacs_lds.yaml \
  --variant "FedAvg=" --variant "FedProx=configs/baselines/fedprox.yaml" --variant "FedGen=configs/baselines/fedgen.yaml" \
  --variant "FedSR=configs/baselines/fedsr.yaml" --variant "FedCiR=configs/fedcir/with_fedcir.yaml" \
  --seeds 0 1 2 --workers 1 --out docs/results/fedcir_lds_pacs.md --command "bash experiments/fedcir_lds.sh $*" "$@"
