"""What a failure costs, against the checkpoint interval, and how long a killed job takes to resume.

    python -m bench.recovery [--intervals 0 50 10] [--kill-at 80] [--append docs/benchmarks.md]

For each ``checkpoint.every_steps`` value one demo-sized job (2 workers, 2 epochs, ~9.6k
generated sentences, mining on) runs; rank 0's train worker is SIGKILLed once its MLflow
history passes ``--kill-at`` steps into epoch 2. Ray Train restarts the workers from the
latest checkpoint. From the run's ``train/loss`` history (every step logged, with times):

- steps redone: steps logged twice (trained, lost, trained again);
- seconds lost: between the first and the second logging of the last redone step, i.e.
  failure detection + worker restart + the redone steps;
- redoing: the redone steps' count times their pace after the restart; the rest of the
  seconds lost is detection and restart overhead.

Then one job is SIGKILLed (the driver and its local Ray) after its second checkpoint, and
the same command is run again: time to resume is from that command's start to its first
``[train] resumed`` line, against the same command's time to its first step from scratch.
"""

from __future__ import annotations

import os
import platform
import re
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from bench.common import Benchmark, machine_report
from bench.running_job import RunningJob, snapshot_checkpoints, steps_redone, wait_for

BENCHMARK = Benchmark(__spec__.name, "Recovery: worker kill and driver kill")

BASE = ["data.generated.num_groups=2500", "train.epochs=2", "train.log_every=5"]


def _client(cwd: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")


def _max_step(client: MlflowClient) -> int:
    experiment = client.get_experiment_by_name("simcse-demo")
    if experiment is None:
        return 0
    runs = client.search_runs([experiment.experiment_id])
    if not runs:
        return 0
    history = client.get_metric_history(runs[0].info.run_id, "train/loss")
    return max((m.step for m in history), default=0)


def worker_kill(every_steps: int, kill_at: int) -> dict:
    cwd = Path(tempfile.mkdtemp(prefix="recovery-"))
    job = RunningJob(cwd, ["run.name=bench", f"checkpoint.every_steps={every_steps}", *BASE])
    client = _client(cwd)
    try:
        spe = int(
            wait_for(
                lambda: re.search(r"over (\d+) steps on plan v0", job.output), 600, "epoch 1", job
            ).group(1)
        )
        wait_for(lambda: _max_step(client) >= spe + kill_at, 600, f"step {spe + kill_at}", job, 0.2)
        rank0 = set(re.findall(r"RayTrainWorker pid=(\d+)\)", job.output))
        victim = next(p for p in job.processes("RayTrainWorker") if str(p.pid) in rank0)
        victim.kill()
        code = job.wait(timeout=900)
    finally:
        job.kill_all()
    assert code == 0, job.output[-3000:]
    run = client.search_runs([client.get_experiment_by_name("simcse-demo").experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "train/loss")
    redone, lost = steps_redone(history)
    resumed = int(re.search(r"resumed at step (\d+)", job.output).group(1))
    # The redone steps' second loggings: how long redoing them took, at the pace of that moment.
    again = sorted(max(m.timestamp for m in history if m.step == step) for step in redone)
    per_step = (again[-1] - again[0]) / 1000 / max(len(again) - 1, 1)
    return {
        "interval": every_steps or f"epoch ({spe})",
        "resumed_from": resumed,
        "redone": len(redone),
        "lost_s": lost,
        "redo_s": len(redone) * per_step,
        "per_step_s": per_step,
    }


def driver_kill() -> dict:
    cwd = Path(tempfile.mkdtemp(prefix="recovery-driver-"))
    overrides = ["run.name=bench", "checkpoint.every_steps=20", *BASE]
    first = RunningJob(cwd, overrides)
    try:
        wait_for(lambda: len(snapshot_checkpoints(cwd / "runs/bench")) >= 2, 600, "two checkpoints", first)
        first_step_s = first.first_line_time(r"\[eval\] epoch 0 step 0")
        first.proc.kill()
        first.wait(timeout=30)
    finally:
        first.kill_all()
    started = time.monotonic()
    second = RunningJob(cwd, overrides)
    try:
        wait_for(lambda: second.first_line_time(r"\[train\] resumed at step"), 600, "the resume", second)
    finally:
        second.kill_all()
    return {
        "resume_s": second.first_line_time(r"\[train\] resumed at step"),
        "fresh_start_s": first_step_s,
        "wall_s": time.monotonic() - started,
    }


def main() -> None:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--intervals", type=int, nargs="+", default=[0, 50, 10])
    parser.add_argument(
        "--kill-at", type=int, default=80, help="steps into epoch 2 at which rank 0 is killed"
    )
    args = parser.parse_args()
    rows = [worker_kill(every, args.kill_at) for every in args.intervals]
    driver = driver_kill()
    lines = [
        f"Worker kill ({platform.processor() or platform.machine()}, 2 train workers on "
        f"{os.cpu_count()} CPUs; rank 0 SIGKILLed ~{args.kill_at} steps into epoch 2):",
        "",
        "| checkpoint.every_steps | resumed from step | steps redone | seconds lost | of which redoing steps | restart overhead |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['interval']} | {r['resumed_from']} | {r['redone']} | {r['lost_s']:.1f} | "
            f"{r['redo_s']:.1f} ({r['per_step_s']:.2f} s/step) | {r['lost_s'] - r['redo_s']:.1f} |"
        )
    fresh = f"{driver['fresh_start_s']:.1f}" if driver["fresh_start_s"] is not None else "n/a"
    lines += [
        "",
        f"Driver kill: the same command again reached `[train] resumed` {driver['resume_s']:.1f} s after it "
        f"started (a fresh start of that command reached its first evaluation in {fresh} s).",
    ]
    table = "\n".join(lines)
    print(table)
    if args.append:
        title = f"{len(args.intervals)} checkpoint intervals, demo-sized job on CPU"
        BENCHMARK.append(title, machine_report(), table, args.append)


if __name__ == "__main__":
    main()
