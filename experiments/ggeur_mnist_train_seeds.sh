#!/usr/bin/env bash
# GGEUR's label-skew peers' claims under 2 points on 5 training seeds per data seed (issue 38: a claim that rests on
# < 2 points needs >= 5 training seeds per data seed): FedGen and FedFA against FedAvg (docs/ggeur.md: +1.03 and -0.33
# on 5 seeds, each seed both the clients and the training). The setting and the peers' chosen points of
# ggeur_table4_mnist_label_skew.sh (MNIST over 10 clients, Dirichlet(0.1), frozen EfficientNet-Lite0 features + linear
# head, validation fraction 0.1); data seeds 0-2 (partition, subsets, validation split) x training seeds 0-4: 45 runs.
#   bash experiments/ggeur_mnist_train_seeds.sh [--workers 1]
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/ggeur_peer_grids.sh
v=(--variant "FedAvg=")
peer_variants "" "1.0" "0.1"
exec python experiments/study.py --name ggeur_mnist_train_seeds --base configs/ggeur/effnet/mnist_label_skew.yaml \
  "${v[@]}" --seeds 0 1 2 --train_seeds 0 1 2 3 4 --workers 1 --out docs/results/ggeur_mnist_train_seeds.md \
  --command "bash experiments/ggeur_mnist_train_seeds.sh $*" "$@" \
  -- --validation.fraction 0.1 --data.init_args.partition.init_args.beta=0.1
