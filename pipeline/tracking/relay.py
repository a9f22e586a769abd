"""The tracking relay: on a cluster, only the driver's node writes a store that lives on its disk.

The default store (``sqlite:///<cwd>/mlruns.db``, artifacts beside it) is a file on the
driver's disk. Rank 0 and the miner may run on other nodes, where that path is another
machine's file (or nothing), so they do not open such a store themselves: the driver starts a
:class:`TrackingRelay` actor pinned to its own node, and they log through
:class:`RelayedClient`, which has the part of ``MlflowClient`` they use and sends each call to
the relay. A store every node reaches (an ``http(s)://`` server, a database server) is
written directly, as before: :func:`relay_needed` decides which.

Artifacts travel as bytes (a histogram, the refresh table: kilobytes), metrics and tags as
MLflow's own entities. What the workers log does not change with the route.

The relay is a named actor: the workers and the miner are given its name, not its handle,
so that no actor's constructor arguments hold a handle (the miner is restarted from its
arguments after a failure) and each process looks it up when it opens its client.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import ray
from mlflow.tracking import MlflowClient
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

LOCAL_STORE_SCHEMES = ("sqlite", "file", "")
"""Tracking URI schemes whose store is a path on the driver's disk (``""``: a bare path)."""
FORWARDED = frozenset({"log_batch", "set_tag", "get_run", "list_artifacts"})
"""The ``MlflowClient`` calls forwarded as they are (the rest here move files as bytes)."""


def relay_needed(tracking_uri: str) -> bool:
    """True when the store at ``tracking_uri`` is a file on the driver's disk: other nodes must
    log through the relay. An ``http(s)://`` tracking server or a database server is reached
    from every node directly."""
    scheme = tracking_uri.split("://", 1)[0] if "://" in tracking_uri else ""
    return scheme.lower() in LOCAL_STORE_SCHEMES


class TrackingRelay:
    """The one writer of a driver-local store for the workers and the miner: a Ray actor on the
    driver's node (:func:`start_tracking_relay`) holding the only ``MlflowClient`` they use."""

    def __init__(self, tracking_uri: str):
        # No progress bar per download (the refresh table is read back at every refresh).
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in FORWARDED:
            raise ValueError(f"the tracking relay does not forward MlflowClient.{method}")
        return getattr(self.client, method)(*args, **kwargs)

    def log_artifact_bytes(self, run_id: str, name: str, data: bytes, artifact_path: str | None) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / name
            path.write_bytes(data)
            self.client.log_artifact(run_id, str(path), artifact_path)

    def download_artifact_bytes(self, run_id: str, path: str) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            return Path(self.client.download_artifacts(run_id, path, folder)).read_bytes()


class RelayedClient:
    """What rank 0 and the miner call on an ``MlflowClient`` (``log_batch``, ``set_tag``,
    ``get_run``, ``list_artifacts``, ``log_artifact``, ``download_artifacts``), each sent to the
    :class:`TrackingRelay` named ``relay_name`` and answered from there. Errors come back as the
    relay's, so the callers' retries (:class:`~pipeline.tracking.metric_logger.MetricLogger`)
    work unchanged."""

    def __init__(self, relay_name: str):
        self.relay = ray.get_actor(relay_name)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return ray.get(self.relay.call.remote(method, *args, **kwargs))

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self._call("log_batch", run_id, metrics=list(metrics), params=list(params), tags=list(tags))

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        self._call("set_tag", run_id, key, value)

    def get_run(self, run_id: str) -> Any:
        return self._call("get_run", run_id)

    def list_artifacts(self, run_id: str, path: str | None = None) -> Any:
        return self._call("list_artifacts", run_id, path)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        data = Path(local_path).read_bytes()
        ray.get(
            self.relay.log_artifact_bytes.remote(run_id, os.path.basename(local_path), data, artifact_path)
        )

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        target = Path(dst_path) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(ray.get(self.relay.download_artifact_bytes.remote(run_id, path)))
        return str(target)


def tracking_client(tracking_uri: str, relay: str | None = None) -> Any:
    """The client a worker or the miner logs through: the relay's when the driver started one
    (``relay``: its name; the store is on the driver's disk), else an ``MlflowClient`` of the
    store itself."""
    return RelayedClient(relay) if relay is not None else MlflowClient(tracking_uri=tracking_uri)


def start_tracking_relay(tracking_uri: str, run_id: str) -> tuple[Any, str]:
    """The relay actor for the store at ``tracking_uri`` and its name, on this (the driver's)
    node: no CPU of its own (a KubeRay head offers none), restarted if it dies while the job
    runs. The name holds MLflow run ``run_id`` and a fresh suffix: a resumed job in the same
    Ray never meets its predecessor's relay, dead or dying."""
    name = f"simcse-tracking-relay-{run_id}-{uuid.uuid4().hex[:8]}"
    node_id = ray.get_runtime_context().get_node_id()
    actor = ray.remote(TrackingRelay).options(
        name=name,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        max_restarts=-1,
        max_task_retries=3,
        # Uploads and metric batches from rank 0 and the miner at once.
        max_concurrency=4,
    )
    return actor.remote(tracking_uri), name
