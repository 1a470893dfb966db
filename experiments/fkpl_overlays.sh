# Sourced by fkpl_reduced.sh and fkpl_official.sh: the overlays both reduced FKPL studies use (20 rounds), written
# into the folder given.
write_reduced_overlays() {
  local ov=$1
  printf 'method:\n  class_path: flsuite.methods.fedproc.FedProc\n  init_args: {schedule_rounds: 20, tau: 1.0}\n' > "$ov/fedproc.yaml"
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {head: federated, head_rounds: 20}\n' > "$ov/federated_head.yaml"
  printf 'method:\n  class_path: flsuite.methods.fkpl.FKPL\n  init_args: {expert_init: independent}\n' > "$ov/independent.yaml"
}
