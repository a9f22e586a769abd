"""Why a test process died. Under pytest-xdist a test process that dies (segfault, a kill, a
Ray driver that exits because its raylet or GCS went away) is reported only as "worker crashed
while running <test>", with no traceback. :func:`pytest_handlecrashitem` (registered by
``tests/conftest.py``) adds what may say why to that report: the kernel's lines about killed or
crashed processes and the ends of the dead process's local Ray logs, which it wrote down with
:func:`ray_session_noted` when it started that Ray."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

KERNEL_LINES = re.compile(r"(?i)out of memory|killed process|oom|segfault|general protection|trap")
RAY_LOG_ENTRY = re.compile(r"^\[\S+ \S+ ([DIWEF]) \d+ \d+\]")
"""A Ray log line: ``[date time LEVEL pid tid] ...``."""
RAY_LOGS = ("python-core-driver-*.log", "raylet.out", "gcs_server.out")


def _note_path(testrunuid: str, worker: str) -> Path:
    return Path(tempfile.gettempdir()) / f"pytest-{testrunuid}-{worker}-ray-session"


@contextmanager
def ray_session_noted(session_dir: str) -> Iterator[None]:
    """This test process's Ray session folder written down while the ``with`` block runs
    (under pytest-xdist only); a process that dies inside it leaves the note behind."""
    worker, testrunuid = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not (worker and testrunuid):
        yield
        return
    note = _note_path(testrunuid, worker)
    note.write_text(session_dir)
    try:
        yield
    finally:
        note.unlink(missing_ok=True)


def _log_lines(path: Path, lines: int) -> list[str]:
    """The last warning, error and fatal lines of a Ray log (its periodic state dumps left
    out), then its last few lines, which say what the process was doing when it stopped."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    entries = [(match[1], line) for line in text if (match := RAY_LOG_ENTRY.match(line))]
    alarming = [line for level, line in entries if level in "WEF"]
    return alarming[-lines:] + ["  ..."] + [line for _, line in entries[-3:]]


def _kernel_lines() -> list[str]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ["  dmesg could not be read"]
    found = [line for line in out.splitlines() if KERNEL_LINES.search(line)]
    return found[-5:] or ["  nothing about killed or crashed processes"]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run with -p no:xdist has no such spec
def pytest_handlecrashitem(crashitem: str, report, sched) -> None:
    """pytest-xdist's hook for a test whose process died: extends ``report.longrepr``."""
    lines = [str(report.longrepr), "kernel (dmesg):", *_kernel_lines()]
    note = _note_path(report.node.workerinput["testrunuid"], report.node.gateway.id)
    if note.exists():
        logs = Path(note.read_text().strip()) / "logs"
        for pattern in RAY_LOGS:
            for path in sorted(logs.glob(pattern))[-1:]:
                lines += [f"{path}:", *("  " + line for line in _log_lines(path, 8))]
        note.unlink(missing_ok=True)
    else:
        lines.append("(the process had started no Ray)")
    report.longrepr = "\n".join(lines)
