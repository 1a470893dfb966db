#!/usr/bin/env bash
# A reduced FKPL study on Office-Caltech-10 that fits the shared 2-core machine: the CPU setting of
# configs/fkpl/office_caltech10_effnet.yaml (frozen EfficientNet-Lite0 features, MLP experts, 10 clients) with
# 20 rounds × 5 local epochs instead of 100 × 10; every peer, FKPL and its two controls (Tables 2, 5, 6).
#   bash experiments/fkpl_office_reduced.sh [--seeds 0 1 2] [--workers 1]
set -euo pipefail
cd "$(dirname "$0")/.."
ov=runs/fkpl_office_reduced_overlays; mkdir -p "$ov"
printf 'method:\n  class_path: flsuite.methods.fedproc.FedProc\n  init_args: {schedule_rounds: 20, tau: 1.0}\n' > "$ov/fedproc.yaml"
printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {head: federated, head_rounds: 20}\n' > "$ov/federated_head.yaml"
python experiments/study.py --name fkpl_office_reduced --base configs/fkpl/office_caltech10_effnet.yaml \
  --variant "FedAvg=configs/fkpl/peers/fedavg.yaml" --variant "FedProx=configs/baselines/fedprox.yaml" \
  --variant "MOON=configs/fkpl/peers/moon.yaml" --variant "FedProto=configs/baselines/fedproto.yaml" \
  --variant "FedProc=$ov/fedproc.yaml" --variant "FPL=configs/baselines/fpl.yaml" --variant "FKPL=" \
  --variant "FKPL federated head=$ov/federated_head.yaml" \
  --variant "FKPL FedAvg encoder=configs/fkpl/controls/fedavg_encoder.yaml" \
  --workers 1 --out docs/results/fkpl_office_reduced.md --command "bash experiments/fkpl_office_reduced.sh $*" "$@" \
  -- --rounds 20 --local.epochs 5 --eval_every 5
python experiments/fkpl_clustering.py runs/fkpl_office_reduced/fkpl/seed* --out docs/results/fkpl_office_reduced_clustering.md --command "bash experiments/fkpl_office_reduced.sh $*"
