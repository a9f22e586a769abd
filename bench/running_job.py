"""``jobs/train.py`` run as a user runs it, watched from outside: its output line by line with
arrival times, its processes by title, and what its checkpoints and MLflow history say about a
failure. The fault tests (``tests/test_failures.py``) and ``python -m bench.recovery`` kill jobs
through it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.common import REPO, job_env, set_flags
from pipeline.core.seams import HOLD_DIR_ENV, HOLD_ENV

DEMO_CONFIG = REPO / "jobs" / "configs" / "demo.yaml"


JOB_PATIENCE_S = 1500.0
"""How long a wait on a running job's progress lasts at most. Such a wait ends as soon as the
job gets there, or ends; this bound only stops a job that hangs. It is not a measure of speed:
on a loaded machine a job reaches a point many minutes after it would on a quiet one."""


class JobWaitError(RuntimeError):
    """A condition on a running job did not come true in time, or the job ended first."""


def titled(root: psutil.Process, title: str) -> list[psutil.Process]:
    """Descendants of ``root`` whose process title contains ``title`` (Ray sets ``ray::Class.method``);
    none once ``root`` is gone."""
    found = []
    try:
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            if title in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class RunningJob:
    """``jobs/train.py`` in its own session, its output collected line by line with arrival times.

    ``holds`` names seam points (:func:`pipeline.core.seams.hold_once`, e.g. ``miner_refresh=1``,
    ``train_step=36``) where the job blocks the first time it gets there, so that a fault lands
    at a point the test chose and not where the clock happens to be (:meth:`wait_held`,
    :meth:`kill_held`). A held process stays blocked until it is killed.
    """

    def __init__(
        self,
        cwd: Path,
        overrides: list[str],
        env: dict | None = None,
        config: str | None = None,
        holds: tuple[str, ...] = (),
    ):
        self.hold_dir = cwd / "holds"
        if holds:
            self.hold_dir.mkdir(exist_ok=True)
            env = {**(env or {}), HOLD_ENV: ",".join(holds), HOLD_DIR_ENV: str(self.hold_dir)}
        args = [
            sys.executable, str(REPO / "jobs" / "train.py"), "--config", config or str(DEMO_CONFIG),
            *set_flags(overrides),
        ]  # fmt: skip
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            args, cwd=cwd, env=job_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first_line_time(self, pattern: str) -> float | None:
        """Seconds from the start to the first output line matching ``pattern`` (None: none yet)."""
        found = next((t for t, line in self.lines if re.search(pattern, line)), None)
        return None if found is None else found - self.started

    def processes(self, title: str) -> list[psutil.Process]:
        """Descendants of the job whose process title (Ray sets ``ray::Class.method``) contains ``title``."""
        if self.proc.returncode is not None:
            return []  # reaped: the pid may be another process's now
        try:
            return titled(psutil.Process(self.proc.pid), title)
        except psutil.NoSuchProcess:
            return []

    def wait_held(self, point: str, what: str, timeout: float = JOB_PATIENCE_S) -> int:
        """The pid of the job's process blocked at the seam ``point`` (one of ``holds``), once
        it is.

        Raises:
            JobWaitError: not within ``timeout`` s, or the job ended first.
        """
        return wait_for(lambda: held_pid(self.hold_dir, point), timeout, what, self)

    def kill_held(self, point: str, title: str, what: str, timeout: float = JOB_PATIENCE_S) -> psutil.Process:
        """Wait until the job is held at ``point``, then SIGKILL the process held there, whose
        title must contain ``title`` (e.g. ``HardNegativeMiner``); returns that process."""
        victim = psutil.Process(self.wait_held(point, what, timeout))
        assert title in " ".join(victim.cmdline()), (title, victim.cmdline())
        victim.kill()
        return victim

    def running(self) -> bool:
        """Whether the job's process is still running. Unlike ``Popen.poll`` this leaves an
        exited process unreaped, so its pid and process group id stay the job's, never another
        process's, until :meth:`kill_all` has killed what is left of the group."""
        if self.proc.returncode is not None:
            return False
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def wait(self, timeout: float) -> int:
        """The job's exit status; everything it started is killed either way.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` s (it is killed).
        """
        deadline = time.monotonic() + timeout
        try:
            while self.running():
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(self.proc.args, timeout)
                time.sleep(0.1)
        finally:
            self.kill_all()
        self._reader.join(timeout=10)
        assert self.proc.returncode is not None
        return self.proc.returncode

    def kill_all(self) -> None:
        """SIGKILL the job and everything it started (its local Ray included), then reap it.

        Calling it again, or after the job was reaped elsewhere, does nothing: once reaped, its
        pid and group id are free, and with the common ``pid_max`` of 32768 (threads draw from
        the same numbers) a test suite goes round them in minutes, so they may name another
        test's processes by then.
        """
        if self.proc.returncode is not None:
            return
        with_children = []
        with contextlib.suppress(psutil.NoSuchProcess):
            with_children = psutil.Process(self.proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for child in with_children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()  # psutil checks it is still the same process, not a reused pid
        self.proc.wait()


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, job: RunningJob | None = None, poll: float = 0.05
) -> Any:
    """``condition()``'s first true value, polled every ``poll`` seconds.

    Raises:
        JobWaitError: ``timeout`` passed, or ``job`` ended first; with the end of its output.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if job is not None and not job.running():
            raise JobWaitError(f"the job ended while waiting for {what}:\n{job.output[-4000:]}")
        time.sleep(poll)
    raise JobWaitError(f"timed out waiting for {what}" + (f":\n{job.output[-4000:]}" if job else ""))


def held_pid(hold_dir: Path, point: str) -> int | None:
    """The pid of the process held at the seam ``point`` (``point=key``), which
    :func:`pipeline.core.seams.hold_once` writes into ``hold_dir``; None until it has."""
    try:
        text = (hold_dir / f"{point}.held").read_text()
    except FileNotFoundError:
        return None
    return int(text) if text else None  # created, then its pid written


def snapshot_checkpoints(run_dir: Path) -> list[dict]:
    """The checkpoints Ray Train has registered (name + reported metrics), oldest first."""
    # Deferred: the trainer module imports Ray Train, which a watcher needs only here.
    from pipeline.training.trainer import RESUME_SNAPSHOT

    try:
        snapshot = json.loads((run_dir / RESUME_SNAPSHOT).read_text())
    except (OSError, ValueError):
        return []
    return [{"dir": r["checkpoint_dir_name"], **r["metrics"]} for r in snapshot["checkpoint_results"]]


def steps_redone(history: list[Any]) -> tuple[list[int], float]:
    """Steps logged twice in an MLflow metric ``history`` (trained, lost, trained again) and the
    seconds between the first and the second logging of the last of them: the time the
    failure cost."""
    counts = Counter(m.step for m in history)
    redone = sorted(step for step, n in counts.items() if n > 1)
    if not redone:
        return [], 0.0
    last = sorted(m.timestamp for m in history if m.step == redone[-1])
    return redone, (last[-1] - last[0]) / 1000
