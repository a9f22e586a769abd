#!/usr/bin/env bash
# Issue 71's cross-fitted teacher, measured on half the pairs (docs/results.md, "A cross-fitted
# teacher"): does a teacher's KL pass on more where the teacher has not fit the rows it scores?
#
#   bash bench/cross_fit_teacher.sh [ARMS] [SEEDS]   # default: TKx,TK,S at seeds 1,2,3
#
# Needs what bench/teacher_arms.sh makes first: runs/mpnet/all-mpnet-base-v2 and the teacher on
# every row, runs/teacher-mpnet-s1/model.
# 1. the train file split by anchor into two folds (bench.pair_folds) under runs/folds/;
# 2. unless there, the teacher on fold 0 only (the recipe at seed 1 from all-mpnet-base-v2,
#    the pool still every train tweet: about 50 min on 2 cores);
# 3. bench.hard_negatives' arms on fold 1 (--data-path), each scored on dev-distractors, one line
#    each in bench/results/twitter-url-cross-fit.jsonl, runs already there skipped (about 15 min
#    an arm): TKx distils the fold-0 teacher (it has never seen these anchors), TK the teacher on
#    every row (it has fit them), S no teacher;
# 4. bench.in_batch_targets of both teachers on fold 1's pairs: how far their targets differ.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
ARMS=${1:-TKx,TK,S}
SEEDS=${2:-1,2,3}
FULL=runs/teacher-mpnet-s1/model
FOLD0=runs/teacher-mpnet-f0/model
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} HF_HUB_OFFLINE=1

"$PY" -m bench.pair_folds --pairs "$DATA/twitter-url/train.tsv" --folds 2 --out runs/folds
if [ ! -f "$FOLD0/config.json" ]; then
    "$PY" jobs/train.py --config jobs/configs/recipe-twitter-url.yaml \
        --set model.name_or_path=runs/mpnet/all-mpnet-base-v2 --set run.name=teacher-mpnet-f0 \
        --set run.seed=1 --set data.path=runs/folds/fold0.tsv --set tracking.experiment=cross-fit \
        --set 'eval.retrieval=[]' --set 'eval.sts=[]'
fi

BENCH_TEACHER=$FULL BENCH_CROSS_FIT_TEACHER=$FOLD0 "$PY" -m bench.hard_negatives --task twitter-url \
    --data-path runs/folds/fold1.tsv --variants "$ARMS" --seeds "$SEEDS" --skip-done \
    --dev "$DATA/twitter-url/dev-distractors" --results bench/results/twitter-url-cross-fit.jsonl \
    --experiment cross-fit

"$PY" -m bench.in_batch_targets --pairs runs/folds/fold1.tsv --models "$FOLD0,$FULL" \
    --temperatures 0.05,0.1 --max-seq-len 32
