"""MLflow: one run per job, created by the driver; workers and the miner log to it by run id.

The fluent ``mlflow.start_run`` API keeps per-process state, so two Ray processes using it
create two runs. Here only the driver creates (or resumes) the run; rank 0 and the miner get
the run id and log through :class:`MetricLogger`, a thin buffer over ``MlflowClient``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient

from pipeline.errors import first_line

RUN_NAME_TAG = "simcse.run_name"
STATE_TAG = "simcse.state"
ERROR_TAG = "simcse.error"
DEFAULT_DB = "mlruns.db"
DEFAULT_ARTIFACTS = "mlartifacts"


def resolve_tracking_uri(configured: str | None, workdir: Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` > config > embedded sqlite store in the working directory."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if configured:
        return configured
    workdir = (workdir or Path.cwd()).resolve()
    return f"sqlite:///{workdir / DEFAULT_DB}"


def artifact_location_for(tracking_uri: str) -> str | None:
    """Artifacts of an sqlite store go beside the database file.

    Without an explicit location MLflow writes them relative to the process's working
    directory, which for a Ray job is a temporary session folder that disappears.
    Tracking servers choose their own artifact store, so ``None`` for anything else.
    """
    if tracking_uri.startswith("sqlite:///"):
        db_path = Path(tracking_uri[len("sqlite:///") :])
        return (db_path.parent / DEFAULT_ARTIFACTS).resolve().as_uri()
    return None


def ui_command(tracking_uri: str) -> str:
    parsed = urlparse(tracking_uri)
    if parsed.scheme in ("http", "https"):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


@dataclass
class TrackedRun:
    """The job's MLflow run, as the driver holds it."""

    client: MlflowClient
    tracking_uri: str
    run_id: str
    experiment_id: str
    resumed: bool
    already_finished: bool = False

    def log_params(self, params: dict[str, Any]) -> None:
        # MLflow rejects re-logging a param with a different value; a resumed run keeps its
        # original params (the config that created it), so only new keys are logged.
        existing = self.client.get_run(self.run_id).data.params
        items = [Param(k, _param_value(v)) for k, v in params.items() if k not in existing]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log at once, from the driver (rank 0 and the miner use :class:`MetricLogger`)."""
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()]
        )

    def set_note(self, markdown: str) -> None:
        """The run's description in the MLflow UI."""
        self.client.set_tag(self.run_id, "mlflow.note.content", markdown)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(local_path), artifact_path)

    def finish(self) -> None:
        self.client.set_tag(self.run_id, STATE_TAG, "finished")
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))

    @contextmanager
    def failing_on_error(self) -> Iterator[None]:
        """Mark the run FAILED, with the one-line reason as a tag, if the block raises."""
        from pipeline.errors import describe_error

        try:
            yield
        except BaseException as exc:
            self.fail(describe_error(exc))
            raise

    def fail(self, reason: str) -> None:
        self.client.set_tag(self.run_id, ERROR_TAG, reason[:5000])
        self.client.set_tag(self.run_id, STATE_TAG, "failed")
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FAILED))


def _param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text[:6000]


def start_or_resume_run(tracking_uri: str, experiment: str, run_name: str) -> TrackedRun:
    """Create the job's run, or reopen the run an earlier job with the same name created.

    Raises:
        RuntimeError: the tracking store cannot be reached or used.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            experiment_id = client.create_experiment(
                experiment, artifact_location=artifact_location_for(tracking_uri)
            )
        else:
            experiment_id = found.experiment_id
        previous = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
    except Exception as exc:  # MLflow raises many types for an unusable store
        raise RuntimeError(f"MLflow tracking store {tracking_uri} is not usable: {first_line(exc)}") from exc
    if previous:
        run_id = previous[0].info.run_id
        if previous[0].data.tags.get(STATE_TAG) == "finished":
            return TrackedRun(
                client, tracking_uri, run_id, experiment_id, resumed=True, already_finished=True
            )
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        client.set_tag(run_id, STATE_TAG, "running")
        return TrackedRun(client, tracking_uri, run_id, experiment_id, resumed=True)
    run = client.create_run(
        experiment_id, run_name=run_name, tags={RUN_NAME_TAG: run_name, STATE_TAG: "running"}
    )
    return TrackedRun(client, tracking_uri, run.info.run_id, experiment_id, resumed=False)


class MetricLogger:
    """Metric (and tag) logging to an existing run for rank 0 and the miner, sent in the
    background.

    :meth:`log` and :meth:`set_tags` only append to a buffer; a sender thread posts it with
    one ``log_batch`` every ``flush_every_s`` (or when :meth:`flush` asks). A failed send
    (server restarting, network blip) keeps the values and is retried with backoff, so
    training never waits on MLflow and no value is dropped. A value leaves the buffer only
    once MLflow took it. (Unsent metrics travel in checkpoints, see :meth:`unsent`; unsent
    tags do not: the train loop sets its tags again when it resumes.)
    """

    def __init__(self, tracking_uri: str, run_id: str, flush_every_s: float = 5.0):
        import threading

        quick_http_failures()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        self.failed_sends = 0
        self._buffer: list[Metric] = []
        self._tags: dict[str, str] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._sent = threading.Condition(self._lock)
        self._closing = False
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-metrics", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        with self._lock:
            self._buffer.extend(Metric(k, float(v), now, int(step)) for k, v in metrics.items())

    def set_tags(self, tags: dict[str, Any]) -> None:
        with self._lock:
            self._tags.update({key: str(value) for key, value in tags.items()})

    def flush(self) -> None:
        """Ask the sender to post the buffer now (does not wait)."""
        self._wake.set()

    def unsent(self) -> list[tuple[str, float, int, int]]:
        """What MLflow has not taken yet, as ``(key, value, timestamp ms, step)``."""
        with self._lock:
            return [(m.key, m.value, m.timestamp, m.step) for m in self._buffer]

    def requeue(self, metrics: list[tuple[str, float, int, int]]) -> None:
        """Queue metrics another process could not send (their original timestamps kept)."""
        with self._lock:
            self._buffer[:0] = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in metrics]
        self._wake.set()

    def wait_sent(self, timeout: float) -> bool:
        """Block until the buffer is empty (True) or ``timeout`` seconds passed (False)."""
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._buffer or self._tags:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._sent.wait(left)
            return True

    def close(self, timeout: float) -> int:
        """Send what is left (retrying for up to ``timeout`` seconds); returns how many metric
        values and tags are still unsent."""
        self.wait_sent(timeout)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5)
        with self._lock:
            return len(self._buffer) + len(self._tags)

    def _send_loop(self) -> None:
        backoff = 0.0
        while not self._closing:
            self._wake.wait(timeout=backoff or self.flush_every_s)
            self._wake.clear()
            if self._closing:
                return
            while True:
                with self._lock:
                    # MLflow takes at most 1000 values per call, 100 of them tags.
                    chunk = list(self._buffer[:900])
                    tags = dict(list(self._tags.items())[:100])
                if not chunk and not tags:
                    backoff = 0.0
                    break
                try:
                    self.client.log_batch(
                        self.run_id, metrics=chunk, tags=[RunTag(k, v) for k, v in tags.items()]
                    )
                except Exception as exc:  # any transport or server error: keep and retry later
                    self.failed_sends += 1
                    if self.failed_sends == 1 or self.failed_sends % 10 == 0:
                        print(
                            f"[mlflow] could not send {len(chunk)} metric values ({first_line(exc)}); "
                            f"kept and retried (failure {self.failed_sends})",
                            flush=True,
                        )
                    backoff = min(30.0, max(1.0, backoff * 2))
                    break
                with self._lock:
                    del self._buffer[: len(chunk)]
                    for key, value in tags.items():
                        if self._tags.get(key) == value:
                            del self._tags[key]
                    if not self._buffer and not self._tags:
                        self._sent.notify_all()


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


def quick_http_failures() -> None:
    """Let a request to a tracking server fail after one try in this process (unless the user
    set these variables). MLflow's client otherwise retries for minutes inside one call; the
    background senders here keep what failed and retry on their own schedule, and say so.
    Only processes that log in the background (rank 0, the miner) call this, never the driver."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def check_tracking_reachable(tracking_uri: str, timeout_s: float) -> None:
    """Fail fast when an HTTP tracking server does not answer (MLflow's own client would retry
    for minutes first). Any HTTP answer counts as reachable; auth problems surface later
    with MLflow's own message.

    Raises:
        RuntimeError: naming the URI and what went wrong.
    """
    import urllib.error
    import urllib.request

    if urlparse(tracking_uri).scheme not in ("http", "https"):
        return
    url = tracking_uri.rstrip("/") + "/health"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, min(5.0, timeout_s))):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() >= deadline:
                reason = getattr(exc, "reason", exc)
                raise RuntimeError(
                    f"MLflow tracking server {tracking_uri} is not reachable ({reason}) after "
                    f"tracking.connect_timeout_s={timeout_s:g}s; start it or fix tracking.uri / MLFLOW_TRACKING_URI"
                ) from None
            time.sleep(1.0)


VERSIONED_PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "ray",
    "mlflow",
    "faiss-cpu",
    "faiss-gpu-cu12",
)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run's numbers depend on (absent ones left out)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        with suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


GIT_COMMIT_ENV = "SIMCSE_GIT_COMMIT"


def git_commit(start: Path | None = None) -> tuple[str | None, str]:
    """The commit the code runs from and where it came from: ``git rev-parse`` in the
    checkout, else the ``SIMCSE_GIT_COMMIT`` variable (a ``ray job submit`` working dir is
    uploaded without ``.git``, so the submitting side passes it in the job's runtime env).

    Returns ``(commit, source)``; ``commit`` is None when neither is there, and ``source``
    then says why.
    """
    import subprocess

    where = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        )
        if out.stdout.strip():
            return out.stdout.strip(), "checkout"
    except (OSError, subprocess.SubprocessError):
        pass
    given = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if given:
        return given, GIT_COMMIT_ENV
    return None, f"not a git checkout and {GIT_COMMIT_ENV} is not set"


def log_run_context(
    tracked: TrackedRun, source: str, rows: int, digest: str, kind: str, context: str = "training"
) -> str | None:
    """Dataset fingerprint (as an MLflow dataset input, shown in the UI's Datasets column with
    ``context``), the git commit and package versions.

    Returns a one-line note when no commit could be recorded (None when it was)."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag

    dataset = Dataset(
        name=Path(source).name or source,
        digest=digest,
        source_type="uri" if "://" in source else "local",
        source=json.dumps({"uri": source}),
        profile=json.dumps({"num_rows": rows, "kind": kind}),
    )
    tracked.client.log_inputs(
        tracked.run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
    )
    tags: dict[str, Any] = {"data.path": source, "data.rows": rows, "data.digest": digest}
    commit, origin = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["simcse.git_commit_from"] = origin
    tags.update({f"versions.{name}": value for name, value in package_versions().items()})
    tracked.set_tags(tags)
    if commit:
        return None
    return f"no git commit recorded ({origin}; see docs/operations.md, 'Jobs sent with ray job submit')"
