"""Jobs beside other Ray work on one machine: each job runs on the Ray it means and leaves
the others alone.

Ray's defaults guess "the" cluster from ``$RAY_TMPDIR/ray/ray_current_cluster`` (written by
``ray start``) or from the running ``gcs_server`` processes. The tests here share one
``RAY_TMPDIR`` with a ``ray start`` head, so a job that let Ray guess would join or query
that head; they do not touch the machine's default ``/tmp/ray``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, RayHead
from mlflow.tracking import MlflowClient

from bench.common import job_env
from pipeline.core.seams import CONNECT_TIMEOUT_ENV
from pipeline.runtime.cluster import free_port

DEMO = str(REPO / "jobs/configs/demo.yaml")
SMALL = ["train.epochs=2", "data.generated.num_groups=150", "data.generated.sts_pairs=100"]


def _start(cmd: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [PYTHON, *cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _finished_run(db: Path, experiment: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


SUBMITTED_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.slow
def test_jobs_at_once_beside_each_other_and_a_ray_start_head(tmp_path, trained_tiny_model_dir):
    """All at once on one machine: a ``ray start`` head with the README's ``ray job submit`` of
    jobs/train.py (unchanged) running on it, a training job with its own local Ray beside it,
    and an offline mining job whose Ray folder holds a dead cluster's leftovers. Each finishes
    on the Ray it means, each MLflow run is FINISHED, and no output has a traceback."""
    ray_tmp = Path("/tmp") / f"rtc{free_port()}"  # short: Ray's socket paths have a length limit
    stale_tmp = Path("/tmp") / f"rtd{free_port()}"
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(f"sentence number {i} about topic {i % 7}" for i in range(200)) + "\n")
    head = None
    jobs: dict[str, subprocess.Popen] = {}
    outputs: dict[str, str] = {}
    try:
        head = RayHead(tmp_path / "head", num_cpus=4, ray_tmpdir=ray_tmp)
        # What Ray's guessing would find (ray start writes it once the head is up).
        deadline = time.monotonic() + 120
        while not (ray_tmp / "ray" / "ray_current_cluster").is_file():
            assert time.monotonic() < deadline, "ray start never wrote ray_current_cluster"
            time.sleep(0.5)
        # A cluster that died without cleaning up: its file points at a port nothing listens on.
        (stale_tmp / "ray").mkdir(parents=True)
        (stale_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")

        submitted = tmp_path / "submitted"
        submitted.mkdir()
        # Ray uploads the working dir without .git: the README's submit line passes the commit.
        runtime_env = json.dumps({"env_vars": {"SIMCSE_GIT_COMMIT": SUBMITTED_COMMIT}})
        jobs["submitted"] = subprocess.Popen(
            [
                str(Path(PYTHON).parent / "ray"), "job", "submit", "--address", head.dashboard,
                "--working-dir", str(REPO), "--runtime-env-json", runtime_env,
                "--", "python", "jobs/train.py", "--config", "jobs/configs/demo.yaml",
                "--set", "run.name=submitted", "--set", f"run.output_dir={submitted / 'runs'}",
                "--set", f"tracking.uri=sqlite:///{submitted / 'mlruns.db'}", *[a for i in SMALL for a in ("--set", i)],
            ],
            cwd=submitted, env=head.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        local = [
            str(REPO / "jobs/train.py"),
            "--config",
            DEMO,
            "--set",
            "run.name=local",
            "--set",
            "train.num_workers=1",
        ]
        jobs["local"] = _start(
            local + [a for i in SMALL for a in ("--set", i)],
            tmp_path / "local",
            job_env({"RAY_TMPDIR": str(ray_tmp)}),
        )
        jobs["mine"] = _start(
            [str(REPO / "jobs/mine.py"), "--model", str(trained_tiny_model_dir), "--input", str(sentences),
             "--output", "triplets.parquet", "--set", "mining.num_negatives=1"],
            tmp_path / "mine", job_env({"RAY_TMPDIR": str(stale_tmp)}),
        )  # fmt: skip
        started = time.monotonic()
        for name, proc in jobs.items():
            outputs[name] = proc.communicate(timeout=max(60, 900 - (time.monotonic() - started)))[0]
        # The head is still up after all of it.
        with urllib.request.urlopen(f"{head.dashboard}/api/version", timeout=10) as answer:
            assert answer.status == 200
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
        if head is not None:
            head.stop()
        for folder in (ray_tmp, stale_tmp):
            shutil.rmtree(folder, ignore_errors=True)
    for name, out in outputs.items():
        assert jobs[name].returncode == 0, f"{name}:\n{out[-4000:]}"
        assert "Traceback" not in out and "multiple active Ray instances" not in out, (
            f"{name}:\n{out[-4000:]}"
        )
        assert "Failed to connect to GCS" not in out, f"{name}:\n{out[-4000:]}"
    assert "succeeded" in outputs["submitted"]
    for name in ("submitted", "local"):
        assert f"SimCSE run '{name}' finished" in outputs[name]
        assert "batch plans   v0 (random), v1 (mined)" in outputs[name]
        assert (tmp_path / name / "runs" / name / "model" / "config.json").is_file()
        run = _finished_run(tmp_path / name / "mlruns.db", "simcse-demo")
        assert run.info.status == "FINISHED"
    tags = _finished_run(tmp_path / "submitted" / "mlruns.db", "simcse-demo").data.tags
    assert tags["mlflow.source.git.commit"] == SUBMITTED_COMMIT
    assert tags["mlflow.source.name"] == "jobs/train.py"  # the uploaded working dir's script
    assert tags["simcse.git_commit_from"] == "SIMCSE_GIT_COMMIT"
    assert "mined triplets.parquet" in outputs["mine"]
    assert _finished_run(tmp_path / "mine" / "mlruns.db", "simcse-mining").info.status == "FINISHED"


def test_a_cluster_that_does_not_answer_fails_in_seconds_with_one_line(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO],
        cwd=tmp_path, env=job_env({"RAY_ADDRESS": dead, CONNECT_TIMEOUT_ENV: "2"}), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: no Ray cluster answers at RAY_ADDRESS={dead} (Connection refused) after "
        "2s; start it, fix the address, or unset it to start a local Ray"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _finished_run(tmp_path / "mlruns.db", "simcse-demo").info.status == "FAILED"
    # No wall-clock bound: Ray's own client would retry the dead address for many minutes, which
    # the subprocess's 180 s ceiling turns into a failure; the error line names the 2 s wait.
