#!/usr/bin/env bash
# FKPL's mixing bounds (a, b) on PACS, the reduced CPU schedule of fkpl_reduced.sh pacs (20 rounds × 5 local epochs,
# frozen EfficientNet-Lite0 features, 20 clients, threshold 4.2°): the grid of sweeps/fkpl_mixing_bounds.yaml
# (its a and b values, read from the file) as a study, since PACS, unlike Office-Caltech-10, is not saturated.
#   bash experiments/fkpl_mixing_pacs_reduced.sh [--seeds 0] [--workers 1]
set -euo pipefail
cd "$(dirname "$0")/.."
grid=runs/fkpl_mixing_pacs_overlays; mkdir -p "$grid"; variants=()
grid_values() {  # the values of one parameter of the sweep file
  python -c "import sys, yaml; print(*yaml.safe_load(open('sweeps/fkpl_mixing_bounds.yaml'))['parameters'][sys.argv[1]]['values'])" "$1"
}
for a in $(grid_values method.init_args.a); do for b in $(grid_values method.init_args.b); do
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {a: %s, b: %s}\n' "$a" "$b" > "$grid/a${a}_b${b}.yaml"
  variants+=(--variant "a $a, b $b=$grid/a${a}_b${b}.yaml")
done; done
python experiments/study.py --name fkpl_mixing_pacs_reduced --base configs/fkpl/pacs_effnet.yaml "${variants[@]}" \
  --workers 1 --out docs/results/fkpl_mixing_pacs_reduced.md --command "bash experiments/fkpl_mixing_pacs_reduced.sh $*" "$@" \
  -- --rounds 20 --local.epochs 5 --eval_every 5
