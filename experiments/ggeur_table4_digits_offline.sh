#!/usr/bin/env bash
# The GGEUR paper's Table 4 structure on digits_offline (EfficientNet-Lite0 features, linear head): every baseline
# with and without GGEUR (Steps 1 & 2), 3 seeds. Measured on 2 CPU cores: a "+ GGEUR" run (~20k embeddings
# per client) 10-20 s per round, i.e. 8-18 min; a run without GGEUR 1-2 min; finished runs are skipped, so the script can be stopped and rerun.
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
