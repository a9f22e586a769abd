"""A read that fails carries its failure back as a block, and the driver raises it.

Why not let the read task raise: a Ray Data task that raises makes the executor cancel the
tasks still running, the failed one included, and Ray 2.60's cancel can race that task's own
completion and abort the driver process (``Check failed: it != submissible_tasks_.end() Tried
to complete task that was not pending``, ray-project/ray#54846). A job given a malformed file
would die with a C++ stack instead of its one line, its MLflow run left RUNNING. Carried as a
block, the failure reaches the driver after every task has ended normally, and in the reader's
own words (the pyarrow row, the codec error), which Ray's task-error wrapper drops.

The block is ``{READ_FAILURE: [message]}``; Ray Data may join it to the file's blocks read before
it (the column is then null on their rows). It can show up in three places, and each reader
looks there: the dataset's schema (the file failed in its first block: :func:`schema_of`),
the cleaning stage (:func:`passing_read_failures` hands the block on), and the cleaned
blocks (:func:`raise_read_failure`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.errors import first_line, root_cause

READ_FAILURE = "__read_failure__"
"""The one column of the block a failed read yields."""


class ReadFailed(Exception):
    """A read task's failure, raised on the driver; its message is the reader's first line."""


def failure_message(exc: BaseException) -> str:
    """The first line of the innermost cause: what went wrong in the reader, not a wrapper's."""
    exc = root_cause(exc, follow_context=True)
    if isinstance(exc, UnicodeDecodeError):
        # Ray Data appends its retry advice to the codec name, so str(exc) is garbled.
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    return first_line(exc)


def failures_as_blocks(datasource: type) -> type:
    """A subclass of the file-based Ray Data ``datasource`` whose read yields one
    ``{READ_FAILURE: [message]}`` block where the file fails (after the blocks read before),
    instead of raising."""

    class FailuresAsBlocks(datasource):  # type: ignore[misc, valid-type]
        def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
            try:
                yield from super()._read_stream(f, path)
            except Exception as exc:  # noqa: BLE001 - every failure becomes the block
                yield pa.table({READ_FAILURE: [failure_message(exc)]})

    FailuresAsBlocks.__name__ = FailuresAsBlocks.__qualname__ = f"FailuresAsBlocks{datasource.__name__}"
    return FailuresAsBlocks


def schema_of(ds: Any) -> pa.Schema:
    """A read dataset's schema.

    Raises:
        ReadFailed: the file failed in its first block.
    """
    schema = ds.schema()
    if schema is not None and READ_FAILURE in schema.names:
        first = ds.map_batches(_failures_only, batch_format="pyarrow").take(1)
        raise ReadFailed(first[0][READ_FAILURE] if first else "the read failed")
    return schema


def _failure(table: pa.Table) -> str | None:
    if READ_FAILURE not in table.column_names:
        return None
    failures = pc.drop_null(table.column(READ_FAILURE))
    return failures[0].as_py() if len(failures) else None


def _failures_only(batch: pa.Table) -> pa.Table:
    failure = _failure(batch)
    return pa.table({READ_FAILURE: pa.array([] if failure is None else [failure], pa.string())})


def passing_read_failures(clean: Callable[..., pa.Table]) -> Callable[..., pa.Table]:
    """A cleaning stage (``map_batches``, a block per batch) that hands a failure block on as
    it is, for :func:`raise_read_failure` to find."""

    @functools.wraps(clean)
    def stage(batch: pa.Table, **kwargs: Any) -> pa.Table:
        if _failure(batch) is not None:
            return batch
        if READ_FAILURE in batch.column_names:
            batch = batch.drop_columns([READ_FAILURE])
        return clean(batch, **kwargs)

    return stage


def raise_read_failure(tables: list[pa.Table]) -> None:
    """Raise the first failure among the (selected columns of the) cleaned blocks.

    Raises:
        ReadFailed: with the failed read's message.
    """
    for table in tables:
        failure = _failure(table)
        if failure is not None:
            raise ReadFailed(failure)
