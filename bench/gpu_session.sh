#!/usr/bin/env bash
# The measurements of the real job on one lent H100/H200 (issue 17), in parts that each fit
# one device command (10 minutes); run from the repository root on the GPU machine, with
# the bundle carried (python -m bench.gpu_bundle here, then carry [".gpu-bundle"]):
#
#   bash bench/gpu_session.sh PART [PART ...]
#
# Parts, in the order a session runs them:
#   setup     unpack the bundle once (/tmp/gpu-site), check the imports, print the GPU,
#             write the peers' inputs (bench.gpu_inputs: $ROWS generated sentences and a
#             random-weights BERT-base) to /tmp/gpu-inputs
#   step      bench.gpu_step: the per-worker step without Ray, eager and compiled
#   job       the real job (jobs/configs/gpu-one.yaml) through bench.refresh_share at
#             batch 64, sync and async: train sentences/s, MFU, refresh share, encode/kNN rates
#   job1024   the same at batch 1,024, sync
#   compile   the job without mining, eager vs torch.compile default vs reduce-overhead
#   workers2  two DDP ranks on the one GPU (gloo), 0.25 GPU each + the miner's 0.5, on
#             $WORKERS2_ROWS (8,000) rows with mid-epoch checkpoints, killed $KILL_AFTER_S (20) s
#             into epoch 2; then the same command again: it must resume
#   peers     sentence-transformers MNRL training and mine_hard_negatives (torch path) next
#             to ours, same GPU, model and sentences (random weights score every pair above
#             0.95, so both sides mine with relative margin 0; the bundle brings `datasets`)
#   teacher   issue 71: jobs/configs/gpu-teacher.yaml (its inputs first, $TEACHER_PAIRS (125,000)
#             rows): a random MiniLM-size student trains on 0.5 GPU while the miner, on the other
#             0.5, refreshes its 7 negatives a row and has a random BERT-base cross-encoder score
#             every row's 8 pairs (1M) for distillation, before epoch 1 and beside it. The job's
#             log, its MLflow store and the GPU's use every 5 s come back; $TEACHER_SET adds
#             --set overrides (e.g. no GPUs, to try the part on a CPU)
#   scoring   bench.teacher_scoring: the teacher part's cross-encoder scoring $SCORING_ROWS (200,000)
#             of its pairs alone, against sentence-transformers' CrossEncoder.predict (bf16 both)
#   mine      jobs/mine.py on the generated sentences with mining.num_gpus=1: it must say it
#             encoded on cuda (in bf16) and write its triplets; its summary goes to the log
#   shards    bench.sharded_miner (issue 59): one corpus refresh of $SHARD_ROWS (500,000)
#             generated rows with the random BERT-base, over 1 and then 2 shards on the one GPU
#             (0.5 each): the torch path (`auto` picks flat up to 2M rows on a GPU; faiss-gpu
#             does not fit the bundle). Every process's peak, seconds by stage, recall@10
#
# Results go to $OUT (tables appended to $OUT/benchmarks.md, MLflow stores, logs); without
# $OUT, to runs/gpu-session. Every part appends; nothing here stops other processes.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu-session}
SITE=/tmp/gpu-site
INPUTS=/tmp/gpu-inputs
# 80k: `setup` and `job` (both modes) took 533 s together on an H100, inside one 600 s command.
ROWS=${ROWS:-80000}
CONFIG=${CONFIG:-jobs/configs/gpu-one.yaml}  # another config (e.g. demo.yaml) tries a part on a CPU
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
# The bundle only where this Python lacks Ray (the GPU machine), never over an installed one.
if ! "$PY" -c "import ray" 2>/dev/null && [ -f .gpu-bundle/gpu-site.tar.xz ]; then
  [ -d "$SITE/ray" ] || { mkdir -p "$SITE" && tar -xJf .gpu-bundle/gpu-site.tar.xz -C "$SITE"; }
  export PYTHONPATH="$SITE:$PWD"
fi

# The pairs, student and cross-encoder teacher that gpu-teacher.yaml reads, written once.
teacher_inputs() {
  [ -d "$INPUTS/teacher" ] || "$PY" -m bench.gpu_inputs --out "$INPUTS" \
    --config jobs/configs/gpu-teacher.yaml --teacher-pairs "${TEACHER_PAIRS:-125000}"
}

for part in "$@"; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case "$part" in
    setup)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
      "$PY" -c "import ray.train.torch, ray.data, mlflow, faiss, torch; print('ray', ray.__version__, 'mlflow', mlflow.__version__, 'faiss', faiss.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
      [ -d "$INPUTS/initial_model" ] || "$PY" -m bench.gpu_inputs --out "$INPUTS" --config "$CONFIG" --rows "$ROWS"
      ;;
    step)
      "$PY" -m bench.gpu_step --append "$OUT/benchmarks.md" --json "$OUT/gpu-step.json"
      "$PY" -m bench.gpu_step --compile --batch 1024 --append "$OUT/benchmarks.md"
      ;;
    job)
      # The async lead must cover a refresh (10.2 s against 44 ms steps on an H100 at 80k:
      # ~230 steps); at the default 50 the refresh arrived after the boundary.
      "$PY" -m bench.refresh_share --config "$CONFIG" --rows "$ROWS" --epochs 2 --modes sync async \
        --set mining.max_staleness_steps=300 --append "$OUT/benchmarks.md" --copy-dbs "$OUT"
      ;;
    job1024)
      "$PY" -m bench.refresh_share --config "$CONFIG" --rows "$ROWS" --epochs 2 --modes sync \
        --set train.batch_size=1024 --set train.lr=5e-4 --append "$OUT/benchmarks.md"
      ;;
    compile)
      for mode in eager default reduce-overhead; do
        if [ "$mode" = eager ]; then flags=(--set train.compile=off); else
          flags=(--set "train.compile=$mode"); fi
        "$PY" -m bench.refresh_share --config "$CONFIG" --rows "$ROWS" --epochs 2 --modes off \
          "${flags[@]}" --append "$OUT/benchmarks.md"
      done
      ;;
    workers2)
      # Killed (driver and its local Ray, by process group) once epoch 1 has ended and epoch 2
      # has run a while, then the same command again: it must resume from the checkpoint.
      # Two ranks on one GPU all-reduce with gloo through host memory: about 270 ms a step for
      # BERT-base on an H200 (2026-11-28), so an epoch of 40,000 rows took 171 s and the kill,
      # the second start and the resume did not fit one command. 8,000 rows: 125 steps an epoch.
      two=(--config "$CONFIG" --set run.name=gpu-two-ranks --set run.output_dir=/tmp/gpu-session-runs
        --set "tracking.uri=sqlite:///$OUT/workers2.db" --set train.num_workers=2
        --set train.gpus_per_worker=0.25 --set checkpoint.every_steps=40 --set train.epochs=2
        --set "data.generated.num_groups=$((${WORKERS2_ROWS:-8000} / 4))")
      log="$OUT/workers2.log"
      setsid "$PY" jobs/train.py "${two[@]}" >"$log" 2>&1 &
      job=$!
      until grep -q '\[train\] epoch 1/2:' "$log" || ! kill -0 "$job" 2>/dev/null; do sleep 2; done
      sleep "${KILL_AFTER_S:-20}"
      kill -KILL -- "-$job" 2>/dev/null || true
      wait "$job" || true
      "$PY" jobs/train.py "${two[@]}" 2>&1 | tee -a "$log"
      grep -m1 '\[train\] resumed at step' "$log" || { echo "workers2: no resume" >&2; exit 1; }
      ;;
    peers)
      "$PY" -m bench.train_throughput --data "$INPUTS" --model "$INPUTS/initial_model" \
        --configs ours-1w st --steps 300 --warmup-steps 20 --repeats 2 --corpus-label generated \
        --cpus-per-worker 4 --set train.gpus_per_worker=1 \
        --append "$OUT/benchmarks.md"
      "$PY" -m bench.mining_vs_st --data "$INPUTS" --model "$INPUTS/initial_model" --workloads wiki \
        --rows "$ROWS" --relative-margin 0 --repeats 2 --append "$OUT/benchmarks.md"
      ;;
    shards)
      # Its own log under $OUT, written as it goes, and its own limit inside the command's: the
      # first try (2026-11-30) was killed by the command's limit inside a `| grep | tee` whose
      # buffer died with it, and nothing said where the 560 s went. On a failure the Ray nodes'
      # logs come back too.
      log="$OUT/shards.log"
      if ! timeout "${SHARDS_TIMEOUT_S:-420}" "$PY" -m bench.sharded_miner --rows "${SHARD_ROWS:-500000}" \
        --shards 1,2 --shard-gpus 0.5 --head-cpus 8 --index auto --model "$INPUTS/initial_model" \
        --workdir /tmp/sharded-miner --append "$OUT/benchmarks.md" >"$log" 2>&1; then
        tar -czf "$OUT/shards-ray-logs.tgz" -C /tmp/sharded-miner cluster 2>/dev/null || true
        tail -40 "$log" >&2
        echo "shards: the bench failed or ran past ${SHARDS_TIMEOUT_S:-420} s; its log is $log" >&2
        exit 1
      fi
      grep -v "INFO" "$log" | tail -20
      ;;
    teacher)
      # Its own log and limit inside the command's, as `shards` (a kill loses no output).
      teacher_inputs
      read -ra extra <<<"${TEACHER_SET:-}"
      log="$OUT/teacher.log"
      gpu_use=""
      if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$OUT/teacher-gpu.csv" &
        gpu_use=$!
      fi
      status=0
      timeout "${TEACHER_TIMEOUT_S:-480}" "$PY" jobs/train.py --config jobs/configs/gpu-teacher.yaml \
        --set "tracking.uri=sqlite:///$OUT/teacher.db" --set run.output_dir=/tmp/gpu-session-runs \
        "${extra[@]}" >"$log" 2>&1 || status=$?
      [ -z "$gpu_use" ] || kill "$gpu_use" 2>/dev/null || true
      grep -E '\[mining\]|\[train\] epoch|teacher|Error' "$log" | grep -v INFO | tail -40
      if [ "$status" -ne 0 ]; then
        tail -30 "$log" >&2
        echo "teacher: the job failed or ran past ${TEACHER_TIMEOUT_S:-480} s (exit $status); its log is $log" >&2
        exit 1
      fi
      ;;
    scoring)
      teacher_inputs
      "$PY" -m bench.teacher_scoring --cross-encoder "$INPUTS/teacher" --pairs "$INPUTS/pairs/train.tsv" \
        --rows "${SCORING_ROWS:-200000}" --repeats 2 --append "$OUT/benchmarks.md"
      ;;
    mine)
      log="$OUT/mine.log"
      "$PY" jobs/mine.py --model "$INPUTS/initial_model" --input "$INPUTS/wiki/wiki1m_for_simcse.first11914.txt" \
        --output /tmp/gpu-session-runs/mined.parquet --set mining.num_gpus=1 --set mining.relative_margin=0 \
        --set "tracking.uri=sqlite:///$OUT/mine.db" 2>&1 | tee "$log"
      grep -q 'encoded on cuda in bf16' "$log" || { echo "mine: did not encode on the GPU" >&2; exit 1; }
      ;;
    *)
      echo "unknown part '$part' (setup, step, job, job1024, compile, workers2, peers, teacher, scoring, mine, shards)" >&2
      exit 2
      ;;
  esac
done
