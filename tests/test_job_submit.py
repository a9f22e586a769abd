"""jobs/train.py submitted unchanged with `ray job submit` to a head started by `ray start`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, RayHead
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow


@pytest.fixture
def ray_head(tmp_path):
    head = RayHead(tmp_path)
    try:
        yield head
    finally:
        head.stop()


def test_job_submit_runs_train_job_unchanged(ray_head, tmp_path):
    env, dashboard = ray_head.env, ray_head.dashboard
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
