#!/usr/bin/env bash
# GGEUR's Table-4 peer comparison (issue 36) on digits_offline, the offline stand-in for the paper's Digits (MNIST,
# USPS, UCI 8x8 for SVHN, SYN from fonts; configs/ggeur/effnet/digits_offline.yaml: frozen EfficientNet-Lite0
# features + linear head, one client per domain with 10 % of its training split, SGD lr 0.01, batch 16, 10 epochs,
# 50 rounds): FedAvg, FedAvg + GGEUR (Step 1, and Steps 1 & 2, the paper's default) and the peers the paper compares
# in Table 4 (FedMix, FedGen, FedFA), every method with the same head and client optimiser. Tuning policy
# (docs/results.md): each peer gets a 4-point grid on its own key hyperparameter, every point on seeds 0, 1, 2, the
# point kept per method chosen on a validation split (10 % of each client's training data, --select_on val), never on
# the test set; FedAvg and GGEUR have no hyperparameter of their own here.
#   FedMix: lambda in {0.01, 0.05, 0.1, 0.2};  FedGen: alpha = beta in {0.1, 1, 3, 10};  FedFA: p in {0.1, 0.25, 0.5, 1}
# The paper's full Table 4 (every baseline with and without GGEUR) is experiments/ggeur_table4_digits_offline.sh.
# Paired differences: experiments/paired.py over runs/ggeur_table4_peers_digits_offline (docs/ggeur.md).
#   bash experiments/ggeur_table4_peers_digits_offline.sh [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/ggeur_peer_grids.sh
domain_skew_peer_study ggeur_table4_peers_digits_offline configs/ggeur/effnet/digits_offline.yaml \
  "0.01 0.05 0.1 0.2" "0.1 1.0 3.0 10.0" "0.1 0.25 0.5 1.0" "$@"
