#!/usr/bin/env bash
# GGEUR's Table-4 comparison with its peer methods (issue 36) on Office-Caltech-10, real images, domain skew: FedAvg,
# FedAvg + GGEUR (Step 1; Steps 1 & 2) and the augmentation peers the paper compares (FedMix, FedGen, FedFA), all on
# the same frozen EfficientNet-Lite0 features + linear head and the same client optimiser (configs/ggeur/effnet/
# office_caltech10.yaml: GGEUR's Table 8 setting, SGD lr 1e-3, batch 16, 10 epochs, 50 rounds), as the paper runs its
# peers on one CLIP+MLP. Tuning policy (docs/results.md): each peer gets a 3-point grid on its own key hyperparameter,
# every point on seeds 0, 1, 2, the point kept per method chosen on a validation split (10 % of each client's training
# data, --select_on val), never on the test set; FedAvg and GGEUR have no hyperparameter of their own here.
#   FedMix: lambda in {0.01, 0.05, 0.2}          (first-order mixup approximation, means over each client's data)
#   FedGen: alpha = beta in {1, 3, 10}
#   FedFA:  p in {0.25, 0.5, 1.0}                (FFA on the head's input features)
# Paired differences: experiments/paired.py over runs/ggeur_table4_office_caltech10 (docs/ggeur.md).
#   bash experiments/ggeur_table4_office_caltech10.sh [--seeds 0 1 2] [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/ggeur_peer_grids.sh
domain_skew_peer_study ggeur_table4_office_caltech10 configs/ggeur/effnet/office_caltech10.yaml \
  "0.01 0.05 0.2" "1.0 3.0 10.0" "0.25 0.5 1.0" "$@"
