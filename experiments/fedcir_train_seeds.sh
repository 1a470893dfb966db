#!/usr/bin/env bash
# FedCiR's claims under 2 points, on 5 training seeds per data seed (issue 38: a claim that rests on < 2 points needs
# >= 5 training seeds per data seed). PACS, the setting of fedcir_tuned.sh / fedcir_table2.sh (frozen
# EfficientNet-Lite0 features, one client per domain, 50 rounds, validation fraction 0.1), each variant as chosen or
# ablated there: FedAvg, the tuned FedGen and FedProc, the tuned FedCiR (Table I's row) and Table II's cells behind the
# claims (λ_reg 0.5 with and without λ_align, and both λ = 0). Data seeds 0-2 (clients, validation split) x training
# seeds 0-4 (init, sampling, batch order): 105 runs; the paired differences then pair runs by both seeds.
#   bash experiments/fedcir_train_seeds.sh [--workers 1]
set -euo pipefail
cd "$(dirname "$0")/.."
m=--method.init_args
fedcir=configs/fedcir/with_fedcir.yaml
v=(--variant "FedAvg=")
v+=(--variant "FedGen [alpha, beta 1.0, FedCiR's SGD]=configs/baselines/fedgen.yaml,$m.alpha=1.0,$m.beta=1.0")
v+=(--variant "FedProc [tau 0.1]=configs/baselines/fedproc.yaml,configs/fedcir/with_fedproc_rounds50.yaml,$m.tau=0.1")
v+=(--variant "FedCiR [reg 1.0, align 5e-6, kl batch_mean]=$fedcir,$m.lam_reg=1.0,$m.lam_align=5.0e-6,$m.kl_reduction=batch_mean")
for cell in "0.5 5.0e-6" "0.5 0.0" "0.0 0.0"; do
  read -r reg align <<<"$cell"
  v+=(--variant "FedCiR [reg $reg, align ${align/.0e-6/e-6}, kl batch_sum]=$fedcir,$m.lam_reg=$reg,$m.lam_align=$align,$m.kl_reduction=batch_sum")
done
exec python experiments/study.py --name fedcir_pacs_train_seeds --base configs/fedcir/effnet/pacs.yaml "${v[@]}" \
  --seeds 0 1 2 --train_seeds 0 1 2 3 4 --workers 1 --out docs/results/fedcir_pacs_train_seeds.md \
  --command "bash experiments/fedcir_train_seeds.sh $*" "$@" -- --rounds 50 --validation.fraction 0.1
