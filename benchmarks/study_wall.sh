#!/usr/bin/env bash
# Issue 35's acceptance: the wall time of the two profiled studies (docs/performance.md, "Where a study's time goes"),
# each as a researcher runs it, on two trees (worktrees of two commits), alternated, with one feature cache:
#   FedEGG  experiments/fedegg_study.py's runs FedAvg and FedAvg + FedEGG-LH of its table study, Dir(0.1), seed 0,
#           60 rounds each, in one process through the study's own `run` (the profiled slice);
#   FKPL    experiments/study.py on configs/fkpl/pacs_effnet.yaml: FedAvg and FKPL, seed 0, 10 rounds x 5 local
#           epochs (half of experiments/fkpl_reduced.sh's 20), --workers 1: its `flsuite features` for the seed, then
#           one `flsuite fit` per variant (a process each before the warm pool, a warm worker after).
# Each measurement is the whole command's wall time (imports, cache checks, data, training, run folders, the table).
#   bash benchmarks/study_wall.sh BEFORE_TREE AFTER_TREE OUT_DIR [REPS]     (from the repository root)
# e.g. git worktree add /tmp/before 2119235 && git worktree add /tmp/after HEAD &&
#      OMP_NUM_THREADS=1 bash benchmarks/study_wall.sh /tmp/before /tmp/after /tmp/study-wall 2
# Both trees read the data under $FLSUITE_DATA (default: this checkout, whose configs name ../shared/data) and share
# the feature cache under $FLSUITE_CACHE (default: OUT_DIR). One untimed round first runs every side once (it fills
# the cache, and each tree's own cache records such as the cache index). Prints one line per measurement and the
# medians, then each run's metrics.jsonl md5 on both sides (the last measurement's runs: FedEGG's in each tree's
# runs/fedegg/table, FKPL's under OUT_DIR/runs-<side>; each removed before its study's next measurement).
set -euo pipefail
before=$(cd "${1:?usage: study_wall.sh BEFORE_TREE AFTER_TREE OUT_DIR [REPS]}" && pwd)
after=$(cd "${2:?usage: study_wall.sh BEFORE_TREE AFTER_TREE OUT_DIR [REPS]}" && pwd)
mkdir -p "${3:?usage: study_wall.sh BEFORE_TREE AFTER_TREE OUT_DIR [REPS]}"
out=$(cd "$3" && pwd)
reps=${4:-2}
export FLSUITE_DATA=${FLSUITE_DATA:-$PWD} FLSUITE_CACHE=${FLSUITE_CACHE:-$out}
export HF_HUB_OFFLINE=1 WANDB_MODE=offline WANDB_SILENT=true RAY_USAGE_STATS_ENABLED=0 MPLBACKEND=Agg
fedegg='import sys; sys.path.insert(0, "experiments"); import fedegg_study as f
f.run("table", "dir0.1", "FedAvg", [], 0); f.run("table", "dir0.1", "FedAvg + LH", [f.LEVELS["LH"]], 0)'

measure() {  # side tree study -> prints the wall seconds
    local side=$1 tree=$2 study=$3 runs="$out/runs-$1" start
    case $study in
        fedegg) rm -rf "$tree/runs/fedegg/table" ;;
        fkpl) rm -rf "$runs" && mkdir -p "$runs" ;;
    esac
    start=$(date +%s.%N)
    (
        cd "$tree"
        export PYTHONPATH=$tree
        case $study in
            fedegg) python -c "$fedegg" ;;
            fkpl) python experiments/study.py --name study-wall --base configs/fkpl/pacs_effnet.yaml \
                --variant "FedAvg=configs/fkpl/peers/fedavg.yaml" --variant "FKPL=" --seeds 0 --workers 1 \
                --runs "$runs" --out "$runs/table.md" -- --rounds 10 --local.epochs 5 ;;
        esac
    ) >"$out/$side-$study.log" 2>&1 || { echo "$side $study FAILED (log: $out/$side-$study.log)" >&2; exit 1; }
    python -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(date +%s.%N)" "$start"
}

for study in fedegg fkpl; do
    for side in before after; do
        tree=$before; [[ $side == after ]] && tree=$after
        echo "untimed $study $side: $(measure "$side" "$tree" "$study") s"
    done
done
declare -A seconds
for rep in $(seq 1 "$reps"); do
    sides=(before after); (( rep % 2 == 0 )) && sides=(after before)
    for study in fedegg fkpl; do
        for side in "${sides[@]}"; do
            tree=$before; [[ $side == after ]] && tree=$after
            s=$(measure "$side" "$tree" "$study")
            seconds[$study-$side]+="$s "
            echo "rep $rep $study $side: $s s (load $(cut -d' ' -f1 /proc/loadavg))"
        done
    done
done
for study in fedegg fkpl; do
    python - "$study" ${seconds[$study-before]} / ${seconds[$study-after]} <<'EOF'
import statistics, sys
study, rest = sys.argv[1], sys.argv[2:]
before, after = (statistics.median(map(float, part.split())) for part in " ".join(rest).split("/"))
print(f"{study}: before median {before:.1f} s, after median {after:.1f} s, before / after {before / after:.2f}")
EOF
done
for side in before after; do
    tree=$before; [[ $side == after ]] && tree=$after
    for f in $(cd "$tree/runs/fedegg" && find table -name metrics.jsonl | sort) \
        $(cd "$out/runs-$side" && find . -name metrics.jsonl | sort); do
        [[ -f $tree/runs/fedegg/$f ]] && path=$tree/runs/fedegg/$f || path=$out/runs-$side/$f
        echo "metrics.jsonl $side $(md5sum <"$path" | cut -c1-8) ${f#./}"
    done
done
