#!/usr/bin/env bash
# FKPL's studies (issue 12) on the CPU settings (frozen EfficientNet-Lite0 features, MLP experts), 3 seeds:
#   1. Tables 2-3: FedAvg, FedProx, MOON, FedProto, FedProc, FPL, FKPL on Office-Caltech-10 (10 clients), PACS (20)
#   2. Tables 5-6: FKPL vs its federated-head control vs its FedAvg-encoder control
#   3. the clustering: threshold -> V -> purity, from every FKPL run's fkpl_clusters.json (Stage 0's scan)
#   4. a grid over the mixing bounds (a, b) (spec section 6), for the sweep issue's baseline
# Finished runs are skipped (study.py), so the script can be stopped and rerun. Each study writes its table to
# docs/results/fkpl_<study>_<dataset>.md.
#   bash experiments/fkpl_studies.sh [office|pacs|all] [--seeds 0 1 2] [--workers 2]
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}; shift || true
datasets=(office_caltech10 pacs); [[ $which == office ]] && datasets=(office_caltech10); [[ $which == pacs ]] && datasets=(pacs)
for ds in "${datasets[@]}"; do
  base=configs/fkpl/${ds}_effnet.yaml
  python experiments/study.py --name fkpl_methods_$ds --base "$base" \
    --variant "FedAvg=configs/fkpl/peers/fedavg.yaml" --variant "FedProx=configs/baselines/fedprox.yaml" \
    --variant "MOON=configs/fkpl/peers/moon.yaml" --variant "FedProto=configs/baselines/fedproto.yaml" \
    --variant "FedProc=configs/baselines/fedproc.yaml" --variant "FPL=configs/baselines/fpl.yaml" --variant "FKPL=" \
    --seeds 0 1 2 --workers 2 --out docs/results/fkpl_methods_$ds.md --command "bash experiments/fkpl_studies.sh" "$@"
  python experiments/study.py --name fkpl_ablations_$ds --base "$base" \
    --variant "FKPL (DETFA + PCC)=" --variant "federated head=configs/fkpl/controls/federated_head.yaml" \
    --variant "FedAvg encoder + PCC=configs/fkpl/controls/fedavg_encoder.yaml" \
    --seeds 0 1 2 --workers 2 --out docs/results/fkpl_ablations_$ds.md --command "bash experiments/fkpl_studies.sh" "$@"
  grid=runs/fkpl_grid_overlays; mkdir -p "$grid"; variants=()
  for a in 0.0 0.2 0.4 0.6; do for b in 0.4 0.6 0.8 1.0; do
    if awk "BEGIN{exit !($a <= $b)}"; then
      printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {a: %s, b: %s}\n' "$a" "$b" > "$grid/a${a}_b${b}.yaml"
      variants+=(--variant "a $a, b $b=$grid/a${a}_b${b}.yaml")
    fi
  done; done
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {a: 1.0, b: 1.0}\n' > "$grid/a1.0_b1.0.yaml"
  python experiments/study.py --name fkpl_mixing_$ds --base "$base" "${variants[@]}" --variant "a 1, b 1 (no mixing)=$grid/a1.0_b1.0.yaml" \
    --seeds 0 1 2 --workers 2 --out docs/results/fkpl_mixing_$ds.md --command "bash experiments/fkpl_studies.sh" "$@"
done
python experiments/fkpl_clustering.py runs/fkpl_methods_*/fkpl/seed* --out docs/results/fkpl_clustering.md
