#!/usr/bin/env bash
# FedCiR study 2 (issue 24): the paper's Table II ablation on PACS (CPU setting), lambda_reg in {0, 0.5, 1.0} x
# lambda_align in {0, 5e-6} with the KL summed over the batch (kl_reduction: batch_sum, the reading under which the
# paper's 5e-6 can act; docs/fedcir.md), plus the batch-mean form at the paper's values; 50 rounds, 3 seeds, the same
# validation split and run folder as experiments/fedcir_tuned.sh (runs/fedcir_pacs_tuned), so common runs are shared.
# The loss and gradient shares of each term (client/fedcir/*): python experiments/fedcir_shares.py.
#   bash experiments/fedcir_table2.sh [--seeds 0 1 2] [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
m=--method.init_args
v=(--variant "FedAvg=")
for reg in 0.0 0.5 1.0; do
  for align in 0.0 5.0e-6; do
    v+=(--variant "FedCiR [reg $reg, align ${align/.0e-6/e-6}, kl batch_sum]=configs/fedcir/with_fedcir.yaml,$m.lam_reg=$reg,$m.lam_align=$align,$m.kl_reduction=batch_sum")
  done
done
v+=(--variant "FedCiR [reg 0.5, align 5e-6, kl batch_mean]=configs/fedcir/with_fedcir.yaml,$m.lam_reg=0.5,$m.lam_align=5.0e-6,$m.kl_reduction=batch_mean")
exec python experiments/study.py --name fedcir_pacs_tuned --base configs/fedcir/effnet/pacs.yaml "${v[@]}" \
  --seeds 0 1 2 --workers 2 --out docs/results/fedcir_table2_pacs.md --command "bash experiments/fedcir_table2.sh" "$@" \
  -- --rounds 50 --validation.fraction 0.1
