"""MLflow: one run per job, created by the driver; workers and the miner log to it by run id.

The fluent ``mlflow.start_run`` API keeps per-process state, so two Ray processes using it
create two runs. Here only the driver creates (or resumes) the run; rank 0 and the miner get
the run id and log through :class:`MetricLogger`, a thin buffer over ``MlflowClient``.
"""

from __future__ import annotations

import os
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from pipeline.core.errors import describe_error, first_line
from pipeline.core.retry import call_with_retries

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


DESCRIPTION_WIDTH = 100


def run_description(summary: str, headline: str | None = None, width: int = DESCRIPTION_WIDTH) -> str:
    """A console summary as an MLflow run description that reads in the run page: the
    headline first (the summary's first line unless given), then one bullet per labelled line
    (``  label   value`` becomes ``- **label**: value``), every line at most ``width``
    characters where the text has spaces to wrap at. No code block: the UI does not wrap one,
    and a single long line pushed the page's "About this run" out of view."""

    lines = summary.splitlines()
    wrap = {"width": width, "break_long_words": False, "break_on_hyphens": False}
    out = textwrap.wrap(headline or lines[0], **wrap) + [""]
    for line in lines[1:]:
        label, _, value = line.strip().partition("  ")
        item = f"- **{label}**: {value.strip()}" if value.strip() else f"- {label}"
        out += textwrap.wrap(item, subsequent_indent="  ", **wrap)
    return "\n".join(out)


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


def quick_http_failures() -> None:
    """Let a request to a tracking server fail after one try in this process (unless the user
    set these variables). MLflow's client otherwise retries for minutes inside one call; the
    background senders here keep what failed and retry on their own schedule, and say so.
    Only processes that log in the background (rank 0, the miner) call this, never the driver."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


CONNECT_TIMEOUT_S = 15.0
"""How long a job's start waits for an HTTP tracking server: a running server answers in well
under a second, and 15 s also covers one started together with the job."""


def check_tracking_reachable(tracking_uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast when an HTTP tracking server does not answer within ``timeout_s`` (MLflow's
    own client would retry for minutes first). Any HTTP answer counts as reachable; auth
    problems surface later with MLflow's own message.

    Raises:
        RuntimeError: naming the URI and what went wrong.
    """

    if urlparse(tracking_uri).scheme not in ("http", "https"):
        return
    url = tracking_uri.rstrip("/") + "/health"

    def probe() -> None:
        try:
            with urllib.request.urlopen(url, timeout=max(1.0, min(5.0, timeout_s))):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer: a server is there

    try:
        # URLError (refused, unknown host) is an OSError, as is a socket timeout.
        call_with_retries(probe, retry_on=OSError, timeout_s=timeout_s, wait_s=1.0)
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(
            f"MLflow tracking server {tracking_uri} is not reachable ({reason}) after "
            f"{timeout_s:g}s; start it or fix tracking.uri / MLFLOW_TRACKING_URI"
        ) from None
