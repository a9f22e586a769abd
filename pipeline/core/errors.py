"""One-line descriptions of failures, for the console and the MLflow run's error tag."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none. A Ray task
    error's first line names only the task (``ray::Actor.method() (pid=...)``): its cause's
    line is given instead."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and type(exc).__name__.startswith("RayTaskError"):
        return first_line(cause)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def actor_lost_errors() -> tuple[type[BaseException], ...]:
    """What ``ray.get`` raises when the actor that was to answer is gone: an actor error (its
    process or node died, or Ray killed it), or Ray's ``OutOfMemoryError`` when its memory
    monitor killed the worker to save the node, which is not an actor error. Catch both: a
    lost miner or shard is recovered the same way whatever killed it."""
    import ray  # deferred: this module is imported where Ray is not

    return (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


class DataError(ValueError):
    """The corpus cannot be used; the message says why and names the config key."""


class UnrecoverableError(RuntimeError):
    """A failure that restarting the workers cannot fix (the miner gave up, or hangs): the
    job ends at once instead of spending ``train.max_failures`` on it."""


# Failures that happen again, identically, when the same code runs on the same input from
# the same checkpoint: a missing package, a bad config or input, a programming error, a
# batch too big for the device. Anything else (a worker, actor or node that died, a lost
# connection, an error we do not know) is treated as infrastructure and retried.
_DETERMINISTIC = (
    ImportError,
    ConfigError,
    DataError,
    UnrecoverableError,
    MemoryError,
    SyntaxError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    AssertionError,
    NotImplementedError,
    ZeroDivisionError,
)


def root_cause(exc: BaseException, *, follow_context: bool = False) -> BaseException:
    """The innermost exception of a chain: the worker's own exception inside Ray's wrappers
    (task errors, Ray Data's user-code errors, Ray Train's worker-group, controller and
    traceback wrappers) and explicit ``raise ... from`` causes.

    Args:
        exc: the exception caught.
        follow_context: also follow implicit chaining (an exception raised while another
            was being handled, unless ``from None`` suppressed it): a reader's failure that
            Ray Data's wrappers raise inside their own ``except`` blocks.

    Returns:
        The innermost exception; a :class:`ConfigError` or :class:`DataError` met on the
        way is returned as it is, since it is the one-line description already.
    """
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = _inner_exception(exc, follow_context)
        if not isinstance(inner, BaseException) or inner is exc:
            break
        exc = inner
    return exc


def _inner_exception(exc: BaseException, follow_context: bool) -> object:
    """The exception ``exc`` wraps, or None: one step of :func:`root_cause`."""
    inner = getattr(exc, "cause", None)
    # Ray Train keeps the worker's exception beside its traceback text.
    inner = getattr(exc, "_base_exc", None) or inner
    if inner is None and not isinstance(exc, (ConfigError, DataError)):
        # Our own errors are the one-line description already; what they were raised
        # from is kept for --debug's traceback, not for the message.
        inner = exc.__cause__
        if inner is None and follow_context and not exc.__suppress_context__:
            inner = exc.__context__
    # Ray Train wraps controller errors (a worker group that could not start) ...
    inner = getattr(exc, "controller_failure", None) or inner
    # ... and worker errors (TrainingFailedError -> WorkerGroupError -> worker errors)
    worker_failures = getattr(exc, "worker_failures", None)
    if isinstance(worker_failures, dict) and worker_failures:
        inner = next(iter(worker_failures.values()))
    return inner


def is_process_death(exc: BaseException) -> bool:
    """Whether ``exc`` (after :func:`root_cause`) is Ray reporting a process, actor, node or
    object it lost (``RayActorError``, ``NodeDiedError``, ``ObjectLostError``, ...): a cause
    outside the code."""
    return type(root_cause(exc)).__module__.startswith("ray.")


def is_deterministic(exc: BaseException) -> bool:
    """Whether ``exc`` (after :func:`root_cause`) would recur on a retry from the same
    checkpoint. A dead process never counts: its cause is outside the code."""
    cause = root_cause(exc)
    if _is_out_of_memory(cause):
        return True
    if is_process_death(cause):
        return False
    return isinstance(cause, _DETERMINISTIC)


def _is_out_of_memory(exc: BaseException) -> bool:
    """A device out-of-memory of a batch: the same batch comes back after a restart."""
    try:
        # Deferred: core sits under config and the CLI, which answer without loading torch.
        import torch
    except ImportError:
        return False
    return isinstance(exc, torch.OutOfMemoryError)


def describe_error(exc: BaseException) -> str:
    """One line for a failure, unwrapping Ray's wrappers to the worker's own exception."""
    exc = root_cause(exc)
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
    if isinstance(exc, (ConfigError, DataError, TimeoutError, UnrecoverableError)) and message:
        return message  # already names the key or the thing waited for
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
