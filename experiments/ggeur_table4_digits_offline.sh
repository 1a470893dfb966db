#!/usr/bin/env bash
# The GGEUR paper's Table 4 structure on digits_offline (EfficientNet-Lite0 features, linear head): every baseline
# with and without GGEUR (Steps 1 & 2), 3 seeds. Measured on 2 CPU cores (2026-12-05, two runs at a time): FedAvg's
# 50 rounds 29 s, FedAvg + GGEUR's 260 s (~20k embeddings per client); finished runs of the same code and config are
# reused, so the script can be stopped and rerun. GGEUR's peers (FedMix, FedGen, FedFA), each tuned on a validation
# split, are experiments/ggeur_table4_peers_digits_offline.sh.
#   bash experiments/ggeur_table4_digits_offline.sh [--seeds 0 1 2] [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
variants=(--variant "FedAvg=" --variant "FedAvg + GGEUR=configs/ggeur/with_ggeur.yaml"
          --variant "FedAvg (uniform weights)=configs/baselines/fedavg_uniform.yaml")
for m in SCAFFOLD:scaffold MOON:moon FedDyn:feddyn FedOpt:fedopt FedProto:fedproto FedNTD:fedntd FedProx:fedprox; do
  label=${m%%:*} overlay=configs/baselines/${m##*:}.yaml
  variants+=(--variant "$label=$overlay" --variant "$label + GGEUR=$overlay,configs/ggeur/with_ggeur.yaml")
done
exec python experiments/study.py --name ggeur_table4_digits_offline --base configs/ggeur/effnet/digits_offline.yaml \
  "${variants[@]}" --seeds 0 1 2 --workers 2 --out docs/results/ggeur_table4_digits_offline.md \
  --command "bash experiments/ggeur_table4_digits_offline.sh" "$@"
