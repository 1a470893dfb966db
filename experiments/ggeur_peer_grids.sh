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

# The domain-skew peer study (experiments/ggeur_table4_office_caltech10.sh, ggeur_table4_peers_digits_offline.sh):
# FedAvg, FedAvg + GGEUR Step 1 and Steps 1 & 2, and the peers' grids, every point on seeds 0-2, each method's point
# chosen on a 10 % validation split. NAME is the study's, its table's (docs/results/NAME.md) and its script's name.
#   domain_skew_peer_study NAME BASE_CONFIG "FEDMIX_LAMBDAS" "FEDGEN_ALPHA_BETAS" "FEDFA_PS" [study.py options]
domain_skew_peer_study() {
  local name=$1 base=$2
  v=(--variant "FedAvg=" --variant "FedAvg + GGEUR (Step 1)=configs/ggeur/with_ggeur_step1.yaml"
     --variant "FedAvg + GGEUR (Step 1 & 2)=configs/ggeur/with_ggeur.yaml")
  peer_variants "$3" "$4" "$5"
  shift 5
  exec python experiments/study.py --name "$name" --base "$base" "${v[@]}" --select_on val --seeds 0 1 2 --workers 2 \
    --out "docs/results/$name.md" --command "bash experiments/$name.sh" "$@" -- --validation.fraction 0.1
}
