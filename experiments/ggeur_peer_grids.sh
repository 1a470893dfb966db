# Sourced by the GGEUR peer-comparison scripts (experiments/ggeur_table4_*.sh): appends to the array `v` one study
# variant per grid point of GGEUR's peer methods, labelled "Method [setting]" so that study.py --select_on val treats
# each method's points as one group.
#   peer_variants "FEDMIX_LAMBDAS" "FEDGEN_ALPHA_BETAS" "FEDFA_PS"      e.g. peer_variants "0.01 0.05" "1.0 10.0" "0.5"
peer_variants() {
  local m=--method.init_args lam ab p
  for lam in $1; do v+=(--variant "FedMix [lambda $lam]=configs/baselines/fedmix.yaml,$m.lam=$lam"); done
  for ab in $2; do v+=(--variant "FedGen [alpha, beta $ab]=configs/baselines/fedgen.yaml,$m.alpha=$ab,$m.beta=$ab"); done
  for p in $3; do v+=(--variant "FedFA [p $p]=configs/baselines/fedfa.yaml,$m.p=$p"); done
}
