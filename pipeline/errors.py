"""One-line descriptions of failures, for the console and the MLflow run's error tag."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.data import DataError


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
        # Ray Train wraps worker errors (TrainingFailedError -> WorkerGroupError -> worker errors)
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
    if isinstance(exc, (ConfigError, DataError, TimeoutError)) and message:
        return message  # already names the key or the thing waited for
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
