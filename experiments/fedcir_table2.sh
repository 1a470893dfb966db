#!/usr/bin/env bash
# FedCiR study 2 (issue 13): the paper's Table II on PACS (CPU settings), λ_reg ∈ {0, 0.1, 0.5, 1.0} × λ_align ∈
# {0, 5e-6, 1e-3}, with FedAvg and FedGen on the same network for the paper's ordering claim. Shares its run folder
# (runs/fedcir_pacs) with `fedcir_methods.sh pacs`, so their common runs (FedAvg, FedGen) are computed once.
#   bash experiments/fedcir_table2.sh [--seeds 0 1 2] [--workers 1] [-- --rounds 100]
set -euo pipefail
cd "$(dirname "$0")/.."
variants=(--variant "FedAvg=" --variant "FedGen=configs/baselines/fedgen.yaml")
for reg in 0.0 0.1 0.5 1.0; do
  for align in 0.0 5.0e-6 1.0e-3; do
    variants+=(--variant "FedCiR reg $reg align $align=configs/fedcir/with_fedcir.yaml,configs/fedcir/table2/with_lam_reg_$reg.yaml,configs/fedcir/table2/with_lam_align_$align.yaml")
  done
done
exec python experiments/study.py --name fedcir_pacs --base configs/fedcir/effnet/pacs.yaml "${variants[@]}" \
  --seeds 0 1 2 --workers 1 --out docs/results/fedcir_table2_pacs.md --command "bash experiments/fedcir_table2.sh $*" "$@"
