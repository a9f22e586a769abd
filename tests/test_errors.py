"""One-line failure descriptions for the console and the MLflow error tag, from the exception
types Ray really raises (built here, not mocked)."""

from __future__ import annotations

from pipeline.data import DataError
from pipeline.errors import describe_error, first_line


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
