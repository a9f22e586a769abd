"""Delimited files (csv, tsv and headerless ``pairs_tsv``): how a line is split into cells
and named, in one place for the Ray Data reader and the check before Ray, and a failed
read's first bad row in pyarrow's own words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from pipeline.core.errors import DataError
from pipeline.data.formats import filesystem_of

PAIRS_TSV_COLUMNS = ("sentence1", "sentence2", "label")
"""The fields of a ``pairs_tsv`` line, as :func:`~pipeline.data.readers.read_dataset` names
them (a 2-field file has the first two)."""


def pairs_tsv_names(fields: Sequence[str]) -> list[str]:
    """Pyarrow's generated names (``f0``, ``f1``, ...) of a headerless file as
    :data:`PAIRS_TSV_COLUMNS`; fields past the third keep their generated names."""
    return [PAIRS_TSV_COLUMNS[i] if i < len(PAIRS_TSV_COLUMNS) else name for i, name in enumerate(fields)]


def require_pairs_tsv_fields(names: Sequence[str], path: str, key: str) -> None:
    """A ``pairs_tsv`` file has 2 or 3 tab-separated fields per line."""
    if len(names) not in (2, 3):
        raise DataError(
            f"{key}: {path} has {len(names)} tab-separated field{'s' if len(names) != 1 else ''} "
            "on its first line; pairs_tsv reads 2 (sentence1, sentence2) or 3 (sentence1, "
            "sentence2, label), unquoted"
        )


def csv_parse_options(fmt: str) -> Any:
    """How csv/tsv files are split into cells: one place for the reader and the header check,
    so both see the same columns."""
    if fmt == "pairs_tsv":  # quoting off: a field runs to the next tab, quotes included
        return pacsv.ParseOptions(delimiter="\t", quote_char=False, invalid_row_handler=_fail_row)
    return pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", invalid_row_handler=_fail_row)


def _fail_row(row: Any) -> str:
    """A row with the wrong number of fields fails the read, as pyarrow does by default. Said
    explicitly because options without a handler come back from a pickle (Ray Data ships them
    to its read tasks) with a None one that pyarrow 25 calls, printing a TypeError first."""
    return "error"


def csv_read_options(fmt: str) -> Any:
    """Header or not: ``pairs_tsv`` files have none, so pyarrow names the fields ``f0``,
    ``f1``, ... (single-threaded, as Ray Data reads, so errors name the row)."""
    return pacsv.ReadOptions(use_threads=False, autogenerate_column_names=fmt == "pairs_tsv")


_RAY_CSV_FAILURE = re.compile(r"Failed to read CSV file: (.+?)\. Please check the CSV file")


def csv_parse_error(message: str, fmt: str) -> str | None:
    """Pyarrow's own words for the first bad row (``CSV parse error: Row #3: Expected 3
    columns, got 2: ...``) of the file a Ray Data csv read failed on.

    Ray Data's read task reports only that the file failed (its cause does not survive the
    trip back from the task), so the file named in ``message`` is parsed again here, as the
    task parsed it, on this error path only. None when the message names no file or the
    file parses here.
    """
    match = _RAY_CSV_FAILURE.search(message)
    if fmt not in ("csv", "tsv", "pairs_tsv") or match is None:
        return None
    filesystem, inner = filesystem_of(match.group(1))
    try:
        with filesystem.open_input_stream(inner) as stream:
            reader = pacsv.open_csv(
                stream, read_options=csv_read_options(fmt), parse_options=csv_parse_options(fmt)
            )
            for _ in reader:
                pass
    except (OSError, ValueError, pa.ArrowException) as exc:
        return str(exc).splitlines()[0] if str(exc) else None
    return None
