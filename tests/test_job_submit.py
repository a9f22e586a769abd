"""jobs/train.py submitted unchanged with `ray job submit` to a head started by `ray start`."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, job_env
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    bin_dir = Path(PYTHON).parent
    # The job's `python` is resolved on the PATH of whoever started the head: put the venv first.
    env = job_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    gcs_port, dashboard_port = _free_port(), _free_port()
    temp = Path("/tmp") / f"rayt{os.getpid()}"  # short: Ray's unix socket paths have a length limit
    start = subprocess.run(
        [
            str(bin_dir / "ray"), "start", "--head", f"--port={gcs_port}", "--num-cpus=4",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield env, f"http://127.0.0.1:{dashboard_port}"
    finally:
        subprocess.run([str(bin_dir / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_job_submit_runs_train_job_unchanged(ray_head, tmp_path):
    env, dashboard = ray_head
    db = tmp_path / "mlruns.db"
    proc = subprocess.run(
        [
            str(Path(PYTHON).parent / "ray"), "job", "submit", "--address", dashboard, "--working-dir", str(REPO),
            "--", "python", "jobs/train.py", "--config", "jobs/configs/demo.yaml",
            "--set", "run.name=submitted", "--set", f"run.output_dir={tmp_path / 'runs'}",
            "--set", f"tracking.uri=sqlite:///{db}", "--set", "train.epochs=2",
            "--set", "data.generated.num_groups=100",
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SimCSE run 'submitted' finished" in proc.stdout
    assert "succeeded" in proc.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("simcse-demo").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert len(client.get_metric_history(runs[0].info.run_id, "mining_total_s")) == 1
    assert (tmp_path / "runs" / "submitted" / "model" / "config.json").exists()
