#!/usr/bin/env bash
# Could FedDyn gain from GGEUR on digits_offline, as the paper's Table 4 reports (+3.12 AVG)? The Table-4 study
# (experiments/ggeur_table4_digits_offline.sh) runs FedDyn at GGEUR's alpha = 0.5 with and without GGEUR and finds no
# gain. Here FedDyn's own key hyperparameter gets the suite's tuning policy (docs/results.md): a 3-point grid on alpha,
# every point on seeds 0, 1, 2, with and without GGEUR (Steps 1 & 2), alpha kept per row on a validation split (10 % of
# each client's training data, --select_on val), never on the test set; the paired difference is "+ GGEUR" minus FedDyn
# at their kept alphas. Grid: alpha in {0.01, 0.1, 0.5} (FedDyn's paper searched {0.1, 0.01, 0.001}; 0.5 is GGEUR's).
# 18 runs, 41 min on 2 cores beside other studies (2026-12-05): a FedDyn run's 50 rounds 31-104 s, FedDyn + GGEUR's
# 6.4-8.6 min (alpha 0.01's runs).
#   bash experiments/ggeur_table4_feddyn_alpha.sh [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
variants=()
for alpha in 0.01 0.1 0.5; do
  variants+=(--variant "FedDyn [alpha $alpha]=configs/baselines/feddyn.yaml,--method.init_args.alpha=$alpha"
             --variant "FedDyn + GGEUR [alpha $alpha]=configs/baselines/feddyn.yaml,configs/ggeur/with_ggeur.yaml,--method.init_args.alpha=$alpha")
done
exec python experiments/study.py --name ggeur_table4_feddyn_alpha --base configs/ggeur/effnet/digits_offline.yaml \
  "${variants[@]}" --select_on val --seeds 0 1 2 --workers 2 --out docs/results/ggeur_table4_feddyn_alpha.md \
  --command "bash experiments/ggeur_table4_feddyn_alpha.sh" "$@" -- --validation.fraction 0.1
