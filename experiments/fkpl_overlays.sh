# Sourced by fkpl_reduced.sh, fkpl_official.sh and fkpl_train_seeds.sh: the overlays the reduced FKPL studies use (20
# rounds), written into the folder given, and FKPL's official setting.
write_reduced_overlays() {
  local ov=$1
  printf 'method:\n  class_path: flsuite.methods.fedproc.FedProc\n  init_args: {schedule_rounds: 20, tau: 1.0}\n' > "$ov/fedproc.yaml"
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {head: federated, head_rounds: 20}\n' > "$ov/federated_head.yaml"
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {expert_init: independent}\n' > "$ov/independent.yaml"
}

# FKPL in the official code's setting on DATASET (office|pacs), as fkpl_official.sh describes it: sets base, layout,
# mixing, stage0 and fkpl (FKPL's overlays, comma-separated), its threshold overlay written into the folder OV.
official_fkpl() {
  local dataset=$1 ov=$2 threshold head_epochs
  case $dataset in
    office) base=configs/fkpl/office_caltech10_effnet.yaml; layout=configs/fkpl/layout_official_office.yaml
            mixing=configs/fkpl/official_mixing.yaml; threshold=5.3; head_epochs=20 ;;
    pacs) base=configs/fkpl/pacs_effnet.yaml; layout=configs/fkpl/layout_official_pacs.yaml
          mixing=configs/fkpl/official_mixing_pacs.yaml; threshold=4.2; head_epochs=10 ;;
    *) echo "official_fkpl: dataset must be office or pacs, got '$dataset'" >&2; return 2 ;;
  esac
  stage0=configs/fkpl/stage0_official_features.yaml
  mkdir -p "$ov"
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {threshold: %s, head_epochs: %s}\n' "$threshold" "$head_epochs" > "$ov/threshold.yaml"
  fkpl="$layout,$mixing,$stage0,$ov/threshold.yaml"
}
