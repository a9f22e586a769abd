"""What a hard-negative refresh costs a training run: its share of an epoch, sync and async.

    python -m bench.refresh_share [--rows 100000] [--epochs 2] [--modes off sync async] \\
        [--set mining.index=ivf ...] [--keep] [--append docs/benchmarks.md]
    python -m bench.refresh_share --reread /tmp/refresh-share-XXXX   # re-render kept runs

Runs the real training job (``jobs/train.py`` with ``jobs/configs/demo.yaml``: the tiny BERT,
2 DDP CPU workers, a local Ray) on a generated corpus of ``--rows`` sentences, once per mode,
each in its own process, in the order given:

- ``off``: mining disabled; every epoch is a reshuffled random plan (epoch times only).
- ``sync``: ``mining.refresh=every_epoch``; at each epoch boundary the workers wait for the refresh.
- ``async``: ``mining.refresh=every_epoch_async``; the refresh starts ``mining.max_staleness_steps`` before the
  boundary and training goes on meanwhile; the boundary never waits.

Read back from each run's MLflow store (sqlite, in a temporary folder): ``train/epoch_seconds`` (the
time inside an epoch's steps), ``mining/refresh_wait_s`` (what the workers waited at each boundary),
the miner's ``mining/*_s`` stage times (logged at the step whose weights it encoded) and
every step's end time (the ``train/loss`` timestamps). Reported per mode:

- refresh s: the miner's own time for one refresh (encode + index + search + plan);
- exposed s: what the refresh cost the training, measured inside the run, so that a machine
  whose speed drifts between runs (this VM's did by 1.7x) does not blur it: the boundary wait,
  plus, for each step that ended while the miner worked (from the snapshot step's end to that
  plus the refresh's own time), its period beyond the mean period of the 200 steps before
  the snapshot. In sync mode that is the wait; in async mode it is mostly what running the
  miner beside the workers took from them (on this 2-core machine they share the cores; on a
  cluster the miner has its own CPUs or GPU);
- share of an epoch: exposed s / (steps per epoch x that mean period).

One table; ``--append FILE`` appends it with the machine, the command line and the date.
At the defaults (100k rows, 2 epochs, 3 modes) about 12 minutes on 2 CPU cores; run nothing
else meanwhile.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, Benchmark, machine_report, run_train_job
from pipeline.config.data_section import GENERATED_GROUP_SIZE

BENCHMARK = Benchmark(__spec__.name, "Refresh share of an epoch, sync and async")

MODES = ("off", "sync", "async")


def run_mode(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One training run in its own process; returns its per-epoch metrics from MLflow."""

    tracking_uri = f"sqlite:///{workdir / 'mlruns.db'}"
    overrides = [
        f"run.name=refresh-share-{mode}",
        f"run.output_dir={workdir / 'runs'}",
        f"data.generated.num_groups={args.rows // GENERATED_GROUP_SIZE}",
        "data.generated.sts_pairs=0",  # no evaluation: boundaries hold only the refresh
        f"train.epochs={args.epochs}",
        "train.log_every=50",
        f"tracking.uri={tracking_uri}",
        "tracking.experiment=bench-refresh-share",
        {"off": "mining.refresh=never", "sync": "mining.refresh=every_epoch"}.get(
            mode, "mining.refresh=every_epoch_async"
        ),
        *args.set,
    ]
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "output.log"
    print(f"[bench] {mode}: jobs/train.py --config {args.config} ... ({log_path})", flush=True)
    wall = run_train_job(overrides, workdir, log_path, f"the {mode} run", config=args.config)

    result = read_run(workdir)
    result["wall_s"] = wall
    print(
        f"[bench] {mode}: {wall:.0f}s; epochs {', '.join(f'{s:.1f}' for s in result['epoch_s'])} s; "
        f"waits {', '.join(f'{s:.1f}' for s in result['wait_s'])} s; refreshes "
        f"{', '.join(f'{s:.1f}' for s in result['mining_total_s'])} s",
        flush=True,
    )
    return result


def read_run(workdir: Path) -> dict[str, Any]:
    """A finished run's per-epoch, per-step and per-refresh numbers from its MLflow store."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.refresh_table import read_refresh_table

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlruns.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("bench-refresh-share").experiment_id)

    def metrics(key: str) -> list[Any]:
        return sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)

    def history(key: str) -> list[float]:
        return [m.value for m in metrics(key)]

    result = {
        "epoch_s": history("train/epoch_seconds"),
        "epoch_end_steps": [m.step for m in metrics("train/epoch_seconds")],
        "wait_s": history("mining/refresh_wait_s"),
        "step_end_s": [m.timestamp / 1000 for m in metrics("train/loss")],
        "snapshot_steps": [m.step for m in metrics("mining/total_s")],
    }
    table = read_refresh_table(client, run.info.run_id)  # the per-refresh diagnostics
    for stage in ("encode", "index", "search", "plan", "total"):
        result[f"mining_{stage}_s"] = [row[f"{stage}_s"] for row in table]
    result["corpus_size"] = [row["corpus_size"] for row in table]
    for key in ("sentences_per_s", "tokens_per_s", "mfu"):
        result[key] = steady_median(history(f"train/{key}"))
    result["exposed_s"], result["base_period_s"] = exposed_seconds(result)
    return result


def steady_median(values: list[float], skip: int = 10) -> float:
    """Median of a per-step metric after its first ``skip`` steps (warm-up, compilation)."""
    import numpy as np

    steady = values[skip:] if len(values) > skip else values
    return float(np.median(steady)) if steady else float("nan")


def per_second(counts: list[float], seconds: list[float]) -> float:
    """Mean rate over the refreshes: rows handled per second of a miner stage."""
    rates = [c / s for c, s in zip(counts, seconds, strict=False) if s > 0]
    return mean(rates)


def exposed_seconds(r: dict[str, Any]) -> tuple[list[float], float]:
    """Per refresh: boundary wait + the extra time of the steps that ended while the miner
    worked, against the mean step period before its snapshot. Also returns that period
    for the first refresh (the whole run's when there is none)."""
    import numpy as np

    ends = np.asarray(r["step_end_s"])  # ends[i]: end of step i + 1
    periods = np.diff(ends)  # periods[i]: step i + 2
    boundary = {s + 1 for s in r["epoch_end_steps"]}  # an epoch's first step holds the boundary
    ordinary = np.array([step not in boundary for step in range(2, len(ends) + 1)], dtype=bool)

    def mean_period(window: np.ndarray) -> float:
        # The mean, with the odd slow step (a metrics flush) capped: step ends are whole ms.
        return float(np.minimum(window, 2 * np.median(window)).mean()) if len(window) else float("nan")

    exposed, base_first = [], mean_period(periods[ordinary])
    for n, (snapshot, seconds) in enumerate(zip(r["snapshot_steps"], r["mining_total_s"], strict=True)):
        before = slice(max(0, snapshot - 201), snapshot - 1)  # periods of the 200 steps up to the snapshot
        base = mean_period(periods[before][ordinary[before]])
        start = ends[snapshot - 1]
        inside = (ends[1:] > start) & (ends[1:] <= start + seconds) & ordinary
        ends_epoch = snapshot in r["epoch_end_steps"]
        wait = r["wait_s"][r["epoch_end_steps"].index(snapshot)] if ends_epoch else 0.0
        exposed.append(wait + float(np.clip(periods[inside] - base, 0, None).sum()))
        if n == 0:
            base_first = base
    return exposed, base_first


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def percent(value: float) -> str:
    return "-" if value != value else f"{100 * value:.1f}%"  # NaN: no MFU logged (no known peak)


def rate_text(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"


def describe_job(args: argparse.Namespace) -> tuple[str, str]:
    """``(CPU or GPU, the run's model and resources in a few words)``, from its config."""
    from pipeline.config.loading import load_config
    from pipeline.model.tiny import TINY_BERT

    cfg = load_config(args.config, args.set)
    model = cfg.model.name_or_path or (
        f"random-weights BERT ({TINY_BERT.num_layers} layers x {TINY_BERT.hidden_size})"
    )
    if cfg.train.use_gpu:
        where = f"{cfg.train.num_workers} DDP worker(s) of {cfg.train.gpus_per_worker:g} GPU"
    else:
        where = f"{cfg.train.num_workers} DDP worker(s) of {cfg.train.cpus_per_worker:g} CPU"
    miner = (
        f"miner {cfg.mining.num_gpus:g} GPU" if cfg.mining.num_gpus else f"miner {cfg.mining.num_cpus:g} CPU"
    )
    device = "GPU" if cfg.train.use_gpu or cfg.mining.num_gpus > 0 else "CPU"
    return device, f"{model}, {where}, {miner}, batch {cfg.train.batch_size}, top_k {cfg.mining.top_k}"


def render(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| mode | epoch s (each) | boundary wait s | refreshes | refresh s (encode / index / search / plan) "
        "| step ms before refresh | exposed s per refresh | share of an epoch "
        "| train sentences/s | train tokens/s | MFU | encode sentences/s | kNN queries/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        refreshes = len(r["mining_total_s"])
        steps_per_epoch = r["epoch_end_steps"][0] if r["epoch_end_steps"] else 0
        exposed_text, share_text, refresh_text = "-", "-", "-"
        if refreshes:
            exposed = mean(r["exposed_s"])
            stages = " / ".join(
                f"{mean(r[f'mining_{s}_s']):.1f}" for s in ("encode", "index", "search", "plan")
            )
            exposed_text = f"{exposed:.1f}"
            share_text = f"{100 * exposed / (steps_per_epoch * r['base_period_s']):.1f}%"
            refresh_text = f"{mean(r['mining_total_s']):.1f} ({stages})"
        lines.append(
            f"| {mode} | {' / '.join(f'{s:.1f}' for s in r['epoch_s'])} | "
            f"{' / '.join(f'{s:.1f}' for s in r['wait_s'])} | {refreshes} | {refresh_text} | "
            f"{1000 * r['base_period_s']:.1f} | {exposed_text} | {share_text} | "
            f"{r['sentences_per_s']:.0f} | {r['tokens_per_s']:.0f} | {percent(r['mfu'])} | "
            f"{rate_text(per_second(r['corpus_size'], r['mining_encode_s']))} | "
            f"{rate_text(per_second(r['corpus_size'], r['mining_search_s']))} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BENCHMARK.parser(__doc__, whole_doc=True)
    parser.add_argument("--rows", type=int, default=100_000, help="generated corpus size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--config", type=Path, default=REPO / "jobs" / "configs" / "demo.yaml")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every run")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders and logs")
    parser.add_argument(
        "--reread",
        type=Path,
        metavar="DIR",
        help="render the runs a --keep run left in DIR instead of running",
    )
    parser.add_argument("--copy-dbs", type=Path, metavar="DIR", help="copy each mode's MLflow store to DIR")
    args = parser.parse_args(argv)
    if args.rows < 4 * GENERATED_GROUP_SIZE or args.epochs < 2:
        parser.error("--rows must be >= 16 and --epochs >= 2 (a refresh happens between epochs)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reread:
        root = args.reread
        results = {mode: read_run(root / mode) for mode in args.modes if (root / mode / "mlruns.db").exists()}
        args.keep = True
    else:
        root = Path(tempfile.mkdtemp(prefix="refresh-share-"))
        results = {mode: run_mode(mode, args, root / mode) for mode in args.modes}
    table = render(results)
    print(table)
    if args.append:
        where, job = describe_job(args)
        body = (
            f"The job `{args.config.name}` ({job}) on {args.rows:,} generated "
            f"sentences, {args.epochs} epochs, no evaluation. Exposed = boundary wait + the extra time of the steps "
            "that ended while the miner worked, against the mean step before it started; share = "
            "exposed / (steps per epoch x that step).\n\n" + table
        )
        title = f"`{args.config.name}` on {where}, {' / '.join(args.modes)}"
        BENCHMARK.append(title, machine_report("torch", "ray", "faiss-cpu"), body, args.append, argv)
    if args.copy_dbs:
        args.copy_dbs.mkdir(parents=True, exist_ok=True)
        for mode in results:
            shutil.copy2(root / mode / "mlruns.db", args.copy_dbs / f"refresh-share-{mode}.db")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"[bench] runs kept in {root}")


if __name__ == "__main__":
    main()
