"""What the miner logs of each refresh to the job's MLflow run, off the refresh's path: the few
charted ``mining/`` metrics, a column of the refresh table, and the similarity histogram.

Uploads go through one background thread in refresh order, with retries, so a slow or
restarting tracking server never holds up a plan and a failed upload only warns.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from pipeline.config.metric_catalogue import mining_charts
from pipeline.core.errors import first_line
from pipeline.core.retry import call_with_retries
from pipeline.mining.refresh_report import RefreshReport
from pipeline.tracking.metric_logger import MetricLogger
from pipeline.tracking.plots import similarity_histogram_png
from pipeline.tracking.refresh_table import add_refresh

UPLOAD_ATTEMPTS = 12
"""Histogram and refresh-table uploads: with waits doubling from 1 s up to 60 s, about 6
minutes of waits (363 s) besides the calls' own time."""


class RefreshLog:
    """The miner's logging into one MLflow run (``logger``'s)."""

    def __init__(self, logger: MetricLogger):
        self.logger = logger
        self._uploads: ThreadPoolExecutor | None = None

    def upload(
        self, what: str, upload: Callable[[MetricLogger], None], cleanup: Callable[[], None] | None = None
    ) -> None:
        """Run ``upload(logger)`` off the refresh's path, one upload at a time in refresh order
        (the refresh table is read and rewritten, so two updates must not interleave).

        A slow or restarting tracking server must not hold up the plan (MLflow's client retries
        for minutes), and a failed upload only warns.
        """
        logger = self.logger
        if self._uploads is None:
            self._uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mining-upload")

        def run() -> None:
            try:
                call_with_retries(
                    lambda: upload(logger),
                    retry_on=Exception,
                    attempts=UPLOAD_ATTEMPTS,
                    wait_s=1.0,
                    max_wait_s=60.0,
                )
            except Exception as exc:
                print(f"[mining] warning: {what} not logged: {first_line(exc)}", flush=True)
            finally:
                if cleanup is not None:
                    cleanup()

        self._uploads.submit(run)

    def wait_logged(self, timeout: float) -> bool:
        """Block until the metrics, histograms and table rows sent so far reached MLflow;
        False (and a warning) when ``timeout`` seconds passed first (one budget for both)."""
        deadline = time.monotonic() + timeout
        done = True
        if self._uploads is not None:
            try:
                self._uploads.submit(lambda: None).result(timeout=timeout)
            except TimeoutError:
                done = False
        done = self.logger.wait_sent(max(0.0, deadline - time.monotonic())) and done
        if not done:
            print(f"[mining] warning: uploads still under way after {timeout:g}s; going on", flush=True)
        return done

    def histogram(
        self, series: dict[str, np.ndarray], name: str, xlabel: str, *, cosine: bool = True
    ) -> None:
        """``mining/<name>.png``: overlaid histograms of ``series`` (``label: values``;
        ``cosine``: values in [-1, 1])."""
        folder = Path(tempfile.mkdtemp(prefix="simcse-hist-"))
        path = folder / f"{name}.png"
        similarity_histogram_png(series, xlabel, str(path), cosine=cosine)
        self.upload(
            name,
            lambda logger: logger.client.log_artifact(logger.run_id, str(path), "mining"),
            cleanup=lambda: shutil.rmtree(folder, ignore_errors=True),
        )

    def refresh(self, report: RefreshReport, step: int, pairs: bool) -> None:
        """Chart the few metrics that move, add every diagnostic to the refresh
        table (one column per refresh), and draw the report's similarity histogram."""
        version, metrics = report.version, report.metrics
        if report.similarities:
            # The negatives the loss will see, next to the random baseline: the pairs task's to
            # their anchors, the corpus task's in-batch.
            xlabel = "cosine similarity to the anchor" if pairs else "cosine similarity of in-batch negatives"
            self.histogram(report.similarities, f"negative_similarity_v{version}", xlabel)
        if report.teacher_histogram:
            # Where the teacher puts the positives, the negatives kept and those its margin
            # dropped: a cross-encoder's scores are logits, not cosines.
            self.histogram(
                report.teacher_histogram, f"teacher_scores_v{version}", "the teacher's score with the anchor",
                cosine=False,
            )  # fmt: skip
        self.logger.log(mining_charts(metrics), step)
        self.logger.flush()
        refresh = {"step": float(step), "plan_version": float(version)}
        refresh.update({key.removeprefix("mining/"): value for key, value in metrics.items()})
        self.upload(
            f"refresh table column v{version}",
            lambda logger: add_refresh(logger.client, logger.run_id, refresh),
        )
