"""Length-grouped batches (``train.group_by_length``): what they save, and what they cost in quality.

    python bench/length_grouping.py [--data ../shared/data] [--model DIR] [--rows 11914] \\
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
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from encode_throughput import WIKI, default_model_dir  # noqa: E402
from markdown_report import append_section, machine_and_versions, machine_info  # noqa: E402
from train_throughput import wiki_simcse_overrides  # noqa: E402

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
        f"train.length_group_batches={args.group_batches}",
        f"eval.sts={args.data / STSB_DEV}",
        "tracking.experiment=bench-length-grouping",
    ]
    command = [sys.executable, str(REPO / "jobs" / "train.py")]
    for item in overrides:
        command += ["--set", item]
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("OMP_NUM_THREADS", None)  # Ray sets each worker's threads from its CPUs
    log = workdir / f"{mode}-s{seed}.log"
    with log.open("w") as out:
        code = subprocess.run(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(
            f"error: the {mode} run (seed {seed}) failed with exit {code}; see {log}:\n{log.read_text()[-3000:]}"
        )
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="../shared/data")
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: the minilm package's)"
    )
    parser.add_argument("--rows", type=int, default=11914, help="Wikipedia sentences (data.max_rows)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--group-batches", type=int, default=50, help="train.length_group_batches")
    parser.add_argument("--warmup-steps", type=int, default=5, help="first steps left out of the speed")
    parser.add_argument("--append", type=Path, default=None, metavar="FILE", help="append the table to FILE")
    args = parser.parse_args()
    if args.model is None:
        args.model = default_model_dir()
    for path in (args.data / WIKI, args.data / STSB_DEV):
        if not path.is_file():
            parser.error(f"{path} not found (--data points at ../shared/data)")
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
        info = machine_info(("torch", "transformers", "ray", "mlflow"))
        command = "python bench/length_grouping.py " + shlex.join(sys.argv[1:])
        section = (
            f"\n### Length-grouped batches: speed and STS-B, all-MiniLM-L6-v2 on CPU ({date.today()})\n\n"
            f"Machine: {machine_and_versions(info)}. Command: `{command}`. "
            f"`jobs/train.py`, unsupervised SimCSE, one epoch over {args.rows:,} Wikipedia sentences "
            f"(batch {args.batch_size}, max length {args.max_seq_len}, lr {args.lr:g}, mean pooling, "
            f"1 worker, mining off); grouped = `train.group_by_length=true`, "
            f"`train.length_group_batches={args.group_batches}`. Spearman on STS-B dev, as the job logs it (x100).\n\n{table}\n"
        )
        append_section(section, args.append)


if __name__ == "__main__":
    main()
