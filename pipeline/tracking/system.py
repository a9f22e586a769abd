"""MLflow's system metrics (CPU, memory, disk, network, GPU) for the machines a run uses."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from pipeline.tracking.relay import tracking_client

SAMPLE_EVERY_S = 10.0
"""Seconds between samples: a stall of a minute shows as several points, and a ten-hour run
has 3,600, which MLflow's charts still draw at once."""
FIRST_SAMPLE_AFTER_S = 1.0
"""The first sample's delay: a CPU share is measured between two readings, so one taken at
once would read a meaningless 0."""


@contextmanager
def system_metrics(
    tracking_uri: str,
    run_id: str,
    interval_s: float = SAMPLE_EVERY_S,
    node_id: str | None = None,
    relay: str | None = None,
) -> Iterator[None]:
    """MLflow's own system metrics (``system/cpu_utilization_percentage``, memory, disk,
    network, and ``system/gpu_*`` where NVIDIA's NVML is installed) for this machine: a sample
    a second after the block starts, every ``interval_s`` seconds while it runs, and one when
    it ends, so that a run of a minute has its chart as a run of a day does. ``node_id`` puts
    a machine's metrics under ``system/<node_id>/``.

    MLflow's monitor is used for what it measures and how it names and logs it; the schedule
    is ours: its own loop samples first after a whole interval and drops the sample in hand
    when it stops, which left short runs without a single point. With ``relay`` (the store is
    on the driver's disk, :mod:`pipeline.tracking.relay`) the samples go through the relay."""

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter
    monitor = (
        _monitor(tracking_uri, run_id, interval_s, node_id)
        if relay is None
        else _relayed_monitor(relay, run_id, interval_s, node_id)
    )
    psutil.cpu_percent()  # the reference reading the first sample's CPU share is measured from
    stop = threading.Event()

    def sample() -> None:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()

    def sample_until_stopped() -> None:
        if stop.wait(min(FIRST_SAMPLE_AFTER_S, interval_s)):
            return
        while True:
            try:
                sample()
            except Exception:  # a tracking store that stopped answering: the run's own metrics say so
                return
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=sample_until_stopped, daemon=True, name="system-metrics")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        with suppress(Exception):  # never fail a run for its last system sample
            sample()


def _monitor(tracking_uri: str, run_id: str, interval_s: float, node_id: str | None) -> SystemMetricsMonitor:
    return SystemMetricsMonitor(
        run_id, sampling_interval=interval_s, resume_logging=True, node_id=node_id, tracking_uri=tracking_uri
    )


IN_MEMORY_STORE = "sqlite:///:memory:"


def _relayed_monitor(relay: str, run_id: str, interval_s: float, node_id: str | None) -> SystemMetricsMonitor:
    """MLflow's monitor with its batch logger's client swapped for the relay's. MLflow's
    monitor opens a store of its own URI at once; an in-memory one is opened, never written, so
    that nothing appears on this node's disk. A resumed run goes on from its last system step
    (what MLflow's ``resume_logging`` reads), read through the relay."""
    for name in ("mlflow.store.db.utils", "alembic"):  # the in-memory store's table creation chatter
        logging.getLogger(name).setLevel(logging.WARNING)
    monitor = SystemMetricsMonitor(
        run_id, sampling_interval=interval_s, node_id=node_id, tracking_uri=IN_MEMORY_STORE
    )
    client = tracking_client(IN_MEMORY_STORE, relay)
    monitor.mlflow_logger.client = client
    prefix = f"system/{node_id}/" if node_id else "system/"
    steps = [m.step for m in client.get_run(run_id).data._metric_objs if m.key.startswith(prefix)]
    monitor._logging_step = max(steps) + 1 if steps else 0  # MLflow's monitor has no setter
    return monitor
