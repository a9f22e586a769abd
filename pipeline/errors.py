"""One-line descriptions of failures, for the console and the MLflow run's error tag."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.data import DataError


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe_error(exc: BaseException) -> str:
    """One line for a failure, unwrapping Ray's wrappers to the worker's own exception."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)
        if inner is None and not isinstance(exc, (ConfigError, DataError)):
            # Our own errors are the one-line description already; what they were raised
            # from is kept for --debug's traceback, not for the message.
            inner = exc.__cause__
        # Ray Train wraps controller errors (a worker group that could not start) ...
        inner = getattr(exc, "controller_failure", None) or inner
        # ... and worker errors (TrainingFailedError -> WorkerGroupError -> worker errors)
        worker_failures = getattr(exc, "worker_failures", None)
        if isinstance(worker_failures, dict) and worker_failures:
            inner = next(iter(worker_failures.values()))
        if inner is None or inner is exc:
            break
        exc = inner
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    kind = type(exc).__name__
    if kind == "UnserializableException":
        # An exception Ray could not rebuild on this side: its last traceback line still
        # says what it was ("tarfile.AbsoluteLinkError: ...").
        original = [line for line in getattr(exc, "_original_stack_trace", "").splitlines() if line.strip()]
        last = next((line for line in reversed(original) if not line.startswith(" ")), "")
        return last.strip() or message
    if kind == "WorkerGroupStartupTimeoutError":
        return f"the train workers were not placed within train.placement_timeout_s: {message}"
    if isinstance(exc, (ConfigError, DataError, TimeoutError)) and message:
        return message  # already names the key or the thing waited for
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
