"""MLflow's system metrics (CPU, memory, GPU) for the node a training worker runs on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def system_metrics(
    tracking_uri: str, run_id: str, interval_s: float, node_id: str | None = None
) -> Iterator[None]:
    """MLflow's own system metrics (``system/cpu_utilization_percentage``, memory, disk,
    network, and ``system/gpu_*`` where NVIDIA's NVML is installed) for this machine, sampled
    every ``interval_s`` seconds while the block runs. ``node_id`` puts a machine's metrics
    under ``system/<node_id>/`` when a run spans several."""
    import logging

    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter
    monitor = SystemMetricsMonitor(
        run_id, sampling_interval=interval_s, resume_logging=True, node_id=node_id, tracking_uri=tracking_uri
    )
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
