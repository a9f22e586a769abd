"""System metrics on a schedule that suits a run of a minute as well as one of a day."""

from __future__ import annotations

import time

from mlflow.tracking import MlflowClient

from pipeline.tracking.system import system_metrics


def test_a_sample_soon_after_the_start_and_one_at_the_end_whatever_the_interval(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run_id = client.create_run(client.create_experiment("system")).info.run_id

    def cpu_points():
        return client.get_metric_history(run_id, "system/cpu_utilization_percentage")

    # An hour's interval: without the first and the last sample this block would log nothing.
    with system_metrics(client.tracking_uri, run_id, interval_s=3600):
        deadline = time.monotonic() + 120
        while not cpu_points():  # the first sample, about a second in
            assert time.monotonic() < deadline, "no first sample"
            time.sleep(0.1)
    points = sorted(cpu_points(), key=lambda m: m.step)
    assert [m.step for m in points] == [0, 1]  # the first, and the one when the block ended
    assert all(0 <= m.value <= 100 for m in points)
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert len(memory) == 2 and all(m.value > 0 for m in memory)
