"""Rank 0's background MLflow logger: metrics and tags buffered and sent in batches, so a
slow tracking server never stalls a training step.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mlflow.entities import Metric, RunTag

from pipeline.core.errors import first_line
from pipeline.tracking.relay import tracking_client
from pipeline.tracking.run import quick_http_failures

FLUSH_EVERY_S = 5.0
"""The sender's interval when nobody asks it to flush: the train loop flushes every
``train.log_every`` steps, so this only bounds how stale the charts get between those, at one
request per process every 5 s."""
DRAIN_TIMEOUT_S = 300.0
"""How long rank 0 retries unsent metrics at the end of training: long enough for a
tracking server to be restarted, short enough that a dead one does not hold a finished job."""


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

    def __init__(
        self, tracking_uri: str, run_id: str, flush_every_s: float = FLUSH_EVERY_S, relay: str | None = None
    ):
        """``relay``: the name of the driver's :class:`~pipeline.tracking.relay.TrackingRelay`,
        when the store is on its disk (sent there instead of opened here)."""
        quick_http_failures()
        self.client = tracking_client(tracking_uri, relay)
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
