"""Delimited files (csv, tsv and headerless ``pairs_tsv``): how a line is split into cells
and named, in one place for the Ray Data reader and the check before Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow.csv as pacsv

from pipeline.core.errors import DataError

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
