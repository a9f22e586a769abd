"""The tracking relay: what rank 0 and the miner send through the driver's node lands in the
store as if they had written it themselves (a real sqlite store, a real relay actor)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking.metric_logger import MetricLogger
from pipeline.tracking.refresh_table import add_refresh, read_refresh_table
from pipeline.tracking.relay import RelayedClient, relay_needed, start_tracking_relay
from pipeline.tracking.run import start_or_resume_run


@pytest.mark.parametrize(
    ("uri", "needed"),
    [
        ("sqlite:////home/ray/mlruns.db", True),
        ("file:///home/ray/mlruns", True),
        ("/home/ray/mlruns", True),
        ("http://mlflow:5000", False),
        ("https://mlflow.example.com", False),
        ("postgresql://user@db/mlflow", False),
        ("databricks", True),  # no scheme separator: read as a path, relayed (the safe side)
    ],
)
def test_only_a_store_on_the_drivers_disk_is_relayed(uri, needed):
    assert relay_needed(uri) is needed


def test_metrics_tags_and_artifacts_sent_through_the_relay_land_in_the_store(ray_local, tmp_path):
    import ray

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    tracked = start_or_resume_run(uri, "relay", "relayed")
    relay, name = start_tracking_relay(uri, tracked.run_id)
    try:
        logger = MetricLogger(uri, tracked.run_id, flush_every_s=0.2, relay=name)
        assert isinstance(logger.client, RelayedClient)
        logger.log({"train/loss": 1.5}, step=3)
        logger.set_tags({"simcse.mining_dtype": "fp32"})
        assert logger.close(timeout=30) == 0
        client = RelayedClient(name)
        add_refresh(client, tracked.run_id, {"step": 10.0, "plan_version": 1.0, "total_s": 0.5})
        add_refresh(client, tracked.run_id, {"step": 20.0, "plan_version": 2.0, "total_s": 0.25})
        histogram = tmp_path / "negative_similarity_v1.png"
        histogram.write_bytes(b"\x89PNG not really")
        client.log_artifact(tracked.run_id, str(histogram), "mining")
    finally:
        ray.kill(relay)
    direct = MlflowClient(tracking_uri=uri)
    run = direct.get_run(tracked.run_id)
    assert [(m.step, m.value) for m in direct.get_metric_history(tracked.run_id, "train/loss")] == [(3, 1.5)]
    assert run.data.tags["simcse.mining_dtype"] == "fp32"
    # The table read back from the store itself, both refreshes in step order.
    assert [(r["step"], r["total_s"]) for r in read_refresh_table(direct, tracked.run_id)] == [
        (10.0, 0.5),
        (20.0, 0.25),
    ]
    downloaded = direct.download_artifacts(
        tracked.run_id, "mining/negative_similarity_v1.png", str(tmp_path / "out")
    )
    assert Path(downloaded).read_bytes() == b"\x89PNG not really"


def test_the_relay_forwards_only_what_the_workers_use(ray_local, tmp_path):
    import ray

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    tracked = start_or_resume_run(uri, "relay", "closed")
    relay, name = start_tracking_relay(uri, tracked.run_id)
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="does not forward MlflowClient.delete_run"):
            ray.get(relay.call.remote("delete_run", tracked.run_id))
    finally:
        ray.kill(relay)
    assert MlflowClient(tracking_uri=uri).get_run(tracked.run_id).info.lifecycle_stage == "active"
