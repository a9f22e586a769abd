"""One-line failure descriptions for the console and the MLflow error tag, from the exception
types Ray really raises (built here, not mocked)."""

from __future__ import annotations

from pipeline.core.errors import DataError, describe_error, first_line


def test_exception_ray_could_not_rebuild_is_described_by_its_original_line():
    from ray.exceptions import UnserializableException

    trace = (
        'Traceback (most recent call last):\n  File "pipeline/model.py", line 9, in pack_dir\n'
        "    tar.add(path)\ntarfile.AbsoluteLinkError: 'model/vocab.txt' is a link to an absolute path\n"
    )
    assert describe_error(UnserializableException(trace)) == (
        "tarfile.AbsoluteLinkError: 'model/vocab.txt' is a link to an absolute path"
    )


def test_worker_group_that_cannot_start_names_the_config_key():
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError
    from ray.train.v2.api.exceptions import ControllerError

    line = describe_error(ControllerError(WorkerGroupStartupTimeoutError(num_workers=4)))
    assert line.startswith("the train workers were not placed within train.placement_timeout_s: ")
    assert "4 workers" in line and "\n" not in line


def test_own_errors_stay_as_written_and_chains_are_unwrapped():
    try:
        try:
            raise OSError("disk gone")
        except OSError as exc:
            raise DataError("data.path: cannot read x.txt as text: disk gone") from exc
    except DataError as exc:
        assert describe_error(exc) == "data.path: cannot read x.txt as text: disk gone"
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ValueError("inner problem\nmore detail")
    assert describe_error(wrapped) == "ValueError: inner problem"
    assert first_line(KeyError()) == "KeyError"


def _as_ray_train_reports_it(exc: BaseException) -> BaseException:
    """A worker's exception the way the Train controller's callbacks receive it."""
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    return UserExceptionWithTraceback(exc, traceback_str=f"Traceback ...\n{type(exc).__name__}: {exc}")


def test_errors_that_repeat_on_every_restart_are_told_from_infrastructure():
    import torch
    from ray.exceptions import ActorDiedError

    from pipeline.core.errors import ConfigError, UnrecoverableError, is_deterministic

    repeats = [
        ModuleNotFoundError("No module named 'faiss'"),
        ConfigError("train.batch_size must be > 0"),
        DataError("data.path: x.csv has no column 'text'"),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        UnrecoverableError("the miner did not return plan v1 within mining.timeout_s=20s"),
        ValueError("model.name_or_path: 'x' is neither a model folder nor a reachable hub model"),
    ]
    transient = [
        ActorDiedError(),  # a worker, actor or node that died
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
        ConnectionResetError("Connection reset by peer"),
        TimeoutError("timed out"),  # a socket timeout: the network, not the input
    ]
    for exc in repeats:
        assert is_deterministic(exc), exc
        assert is_deterministic(_as_ray_train_reports_it(exc)), exc
    for exc in transient:
        assert not is_deterministic(exc), exc
        assert not is_deterministic(_as_ray_train_reports_it(exc)), exc


def test_failure_callback_ends_the_run_on_a_repeating_error_and_retries_a_dead_worker(capsys):
    import pytest
    from ray.exceptions import ActorDiedError
    from ray.train import ControllerError

    from pipeline.core.errors import root_cause
    from pipeline.training.trainer import worker_failure_reporter

    reporter = worker_failure_reporter(max_failures=3)
    # A dead worker beside a collateral gloo error on its peer: infrastructure, retried.
    reporter.after_exception(
        None, {0: _as_ray_train_reports_it(RuntimeError("Connection closed by peer")), 1: ActorDiedError()}
    )
    assert (
        "(failure 1, train.max_failures=3; restarting the workers from the latest checkpoint)"
        in capsys.readouterr().out
    )

    missing = ModuleNotFoundError("No module named 'faiss'")
    with pytest.raises(ControllerError) as raised:
        reporter.after_exception(None, {0: _as_ray_train_reports_it(missing)})
    # Ray Train's failure policy never retries a ControllerError that is not a start-up
    # timeout; the driver's one line comes from the worker's own exception inside it.
    assert root_cause(raised.value) is missing
    assert describe_error(raised.value) == "ModuleNotFoundError: No module named 'faiss'"
    out = capsys.readouterr().out
    assert "worker rank 0 failed: ModuleNotFoundError: No module named 'faiss' (failure 2, " in out
    assert "not retried: it fails the same way on every restart)" in out

    # Retries used up: the last failure says so.
    spent = worker_failure_reporter(max_failures=0)
    spent.after_exception(None, {1: ActorDiedError()})
    assert "(failure 1, train.max_failures=0; giving up)" in capsys.readouterr().out
