#!/usr/bin/env bash
# The engine-change check: run six reference federations for a few rounds and print each metrics.jsonl's md5.
# Run it on the commit before a change and after it; the lines must be equal (byte-identical metrics.jsonl).
# Compare md5s from the same machine only: float rounding follows the CPU's vector kernels (torch's CPU capability,
# printed first), so two machines can give different md5s for the same code (two sets seen on this project's machines).
#   benchmarks/engine_identity.sh OUT_DIR          (from the repository root)
# Another commit without installing it:  git worktree add /tmp/base COMMIT && cd /tmp/base &&
#   PYTHONPATH=/tmp/base FLSUITE_CACHE=/path/to/.cache bash /path/to/benchmarks/engine_identity.sh /tmp/base-runs
set -euo pipefail
out="${1:?usage: benchmarks/engine_identity.sh OUT_DIR}"
export HF_HUB_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true RAY_USAGE_STATS_ENABLED=0 MPLBACKEND=Agg
features="--data.init_args.cache_dir=${FLSUITE_CACHE:-.cache}/features"
run() {  # name rounds args...
    local name=$1 rounds=$2; shift 2
    rm -rf "${out:?}/$name"
    python -c "from flsuite.cli import main; raise SystemExit(main())" fit "$@" --rounds "$rounds" --run_dir "$out/$name" --threads.intra_op 1 --threads.inter_op 1 \
        --progress false --wandb.enabled false >"$out/$name.log" 2>&1 \
        || { echo "$name FAILED (log: $out/$name.log)"; tail -20 "$out/$name.log"; return 1; }
    echo "$(md5sum <"$out/$name/metrics.jsonl" | cut -d' ' -f1)  $name ($(wc -l <"$out/$name/metrics.jsonl") lines)"
}
mkdir -p "$out"
python -c "import platform, torch; print(f'machine: {platform.processor() or platform.machine()}, torch {torch.__version__},'
           f' CPU capability {torch.backends.cpu.get_cpu_capability()}')"
run quickstart_fedavg 3 --config configs/quickstart.yaml
run quickstart_scaffold 3 --config configs/quickstart.yaml --config configs/baselines/scaffold.yaml
run ggeur_mnist_label_skew 2 --config configs/ggeur/effnet/mnist_label_skew.yaml --config configs/ggeur/with_ggeur.yaml \
    "$features"
run fkpl_office_caltech10 2 --config configs/fkpl/office_caltech10_effnet.yaml "$features"
run fedcir_office_caltech10 2 --config configs/fedcir/effnet/office_caltech10.yaml \
    --config configs/fedcir/with_fedcir.yaml "$features"
run fedegg_mnist_dir0.1 2 --config configs/fedegg/cpu/mnist_dir0.1.yaml --config configs/fedegg/with_fedegg.yaml \
    "$features"
