"""Reading inputs with Ray Data: a Ray Dataset per format, the unsupervised corpus's text
column, and a failed read turned into one line naming the file and the config key (the read
tasks carry a failure back as a block, :mod:`pipeline.data.read_failures`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import ray.data

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.columns import corpus_columns, require_columns, require_text_column
from pipeline.data.delimited import csv_parse_options, csv_read_options, pairs_tsv_names
from pipeline.data.formats import infer_format, require_sentence_format
from pipeline.data.placement import ANYWHERE, ReadNodes
from pipeline.data.read_failures import failure_message, failures_as_blocks, schema_of
from pipeline.data.utf8 import _utf8_lines_datasource


def _read_delimited(path: str, read_args: dict[str, Any], **arrow_csv_args: Any) -> Any:
    """``ray.data.read_csv``, its read failures carried as blocks."""
    from ray.data._internal.datasource.csv_datasource import CSVDatasource

    datasource = failures_as_blocks(CSVDatasource)(path, arrow_csv_args=arrow_csv_args)
    return ray.data.read_datasource(datasource, **read_args)


def _read_json_lines(path: str, read_args: dict[str, Any]) -> Any:
    """``ray.data.read_json(lines=True)``, its read failures carried as blocks."""
    from ray.data._internal.datasource.json_datasource import PandasJSONDatasource

    block_bytes = ray.data.DataContext.get_current().target_max_block_size
    datasource = failures_as_blocks(PandasJSONDatasource)(path, target_output_size_bytes=block_bytes)
    return ray.data.read_datasource(datasource, **read_args)


def read_dataset(
    path: str, fmt: str, text_columns: Sequence[str] = (), *, reads: ReadNodes = ANYWHERE
) -> Any:
    """A Ray Dataset over a file, folder or URI in one of the supported formats.

    Text files give two columns, ``text`` and :data:`~pipeline.data.utf8.INVALID_UTF8`;
    ``pairs_tsv`` files :data:`~pipeline.data.delimited.PAIRS_TSV_COLUMNS` (the sentences as
    bytes, the label as a string); the others keep their own columns. ``text_columns`` of a
    csv/tsv file are read as bytes, whatever they look like: CSV has no types (a column of
    numbers is still sentences), and bytes let a cell that is not UTF-8 be dropped and
    counted rather than fail the read.

    A text, csv, tsv, ``pairs_tsv`` or jsonl file that cannot be read gives a failure block in
    place of raising (:mod:`~pipeline.data.read_failures`); parquet files are read by Ray Data
    as they are. ``reads`` says whether the file is read on one node only (its disk's).
    """
    read_args = reads.read_args(path)
    if fmt == "text":
        return ray.data.read_datasource(failures_as_blocks(_utf8_lines_datasource())(path), **read_args)
    if fmt == "pairs_tsv":
        ds = _read_delimited(
            path,
            read_args,
            read_options=csv_read_options(fmt),
            parse_options=csv_parse_options(fmt),
            convert_options=pacsv.ConvertOptions(
                column_types={"f0": pa.binary(), "f1": pa.binary(), "f2": pa.string()}
            ),
        )
        names = schema_of(ds).names
        return ds.rename_columns(dict(zip(names, pairs_tsv_names(names), strict=True)))
    if fmt in ("csv", "tsv"):
        return _read_delimited(
            path,
            read_args,
            parse_options=csv_parse_options(fmt),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in text_columns}),
        )
    if fmt == "jsonl":
        return _read_json_lines(path, read_args)
    return ray.data.read_parquet(path, **read_args)


def read_corpus(section: DataSection, *, reads: ReadNodes = ANYWHERE) -> Any:
    """A Ray Dataset with a string column ``text`` (unclean), and for text files also
    :data:`~pipeline.data.utf8.INVALID_UTF8`."""
    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    require_sentence_format(fmt)
    ds = read_dataset(section.path, fmt, text_columns=[section.text_column], reads=reads)
    if fmt == "text":
        return ds
    columns = corpus_columns(section)
    require_columns(ds, section.path, columns)
    for key, column in columns.items():
        require_text_column(ds, section.path, key, column)
    ds = ds.select_columns([section.text_column])
    return ds.rename_columns({section.text_column: "text"}) if section.text_column != "text" else ds


class _HideErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@contextmanager
def reading(path: str, fmt: str, key: str = "data.path") -> Iterator[None]:
    """Turn a failed read (malformed CSV or JSON, JSON that is not UTF-8, an unreadable
    file, a ``pairs_tsv`` row with the wrong number of fields) into one :class:`DataError`
    naming ``key`` (``data.path``).

    A failure carried back as a block (:class:`~pipeline.data.read_failures.ReadFailed`) gives
    the reader's own first line. One that Ray Data raises (a parquet file, a file that
    cannot be opened) is also logged by Ray Data with its traceback on the console; that copy
    is held back here (it still goes to Ray Data's log file) because the job reports the
    failure as one line, and ``--debug`` shows the traceback, chained to the DataError.
    """
    console = [
        h
        for h in logging.getLogger("ray.data").handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    hide = _HideErrors()
    for handler in console:
        handler.addFilter(hide)
    try:
        yield
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{key}: cannot read {path} as {fmt}: {failure_message(exc)}") from exc
    finally:
        for handler in console:
            handler.removeFilter(hide)
