"""The columns each reader needs (config key -> column) and the one wording of a missing or
non-text column, shared by the check before Ray and the Ray Data readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.delimited import PAIRS_TSV_COLUMNS
from pipeline.data.read_failures import schema_of


def corpus_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column a reader of single texts needs: the unsupervised corpus reader
    (:func:`~pipeline.data.readers.read_corpus`) and, for ``task: pairs``, the candidate-pool
    reader of a csv/tsv/jsonl/parquet ``data.pool`` (:func:`~pipeline.data.pairs.read_pool`)."""
    return {"data.text_column": section.text_column}


def pair_columns(section: DataSection) -> dict[str, str]:
    """Config key -> column the pair reader needs (:func:`~pipeline.data.pairs.read_pairs`):
    anchor, positive, the label when ``data.label_column`` is set, and the negative when
    ``data.negative_column`` is set and ``data.given_negatives`` is on. ``pairs_tsv`` files
    have fields, not columns: none."""
    if section.format == "pairs_tsv":
        return {}
    columns = {
        "data.anchor_column": section.anchor_column,
        "data.positive_column": section.positive_column,
    }
    if section.label_column:
        columns["data.label_column"] = section.label_column
    if section.negative_column and section.given_negatives:
        columns["data.negative_column"] = section.negative_column
    return columns


def input_schema(section: DataSection, pairs: bool) -> dict[str, str]:
    """The columns the job reads from ``data.path``, column -> MLflow column type (``string``,
    ``long``): the training dataset's schema in MLflow. A ``text`` file's lines are ``text``;
    a ``pairs_tsv`` file's fields are named as the reader names them."""
    if not pairs:
        return {"text" if section.format == "text" else section.text_column: "string"}
    if section.format == "pairs_tsv":
        fields = PAIRS_TSV_COLUMNS if section.label_column else PAIRS_TSV_COLUMNS[:2]
        return {name: "long" if name == "label" else "string" for name in fields}
    return {
        column: "long" if key == "data.label_column" else "string"
        for key, column in pair_columns(section).items()
    }


def require_column_names(names: Sequence[str], path: str, wanted: dict[str, str]) -> None:
    """Fail with the config key when a column is missing; ``wanted`` maps key -> column.

    The one place this message is made: the check before Ray
    (:func:`~pipeline.data.input_checks.check_corpus_columns`) and the Ray Data readers report
    a missing column in the same words.
    """
    for key, column in wanted.items():
        if column not in names:
            raise DataError(f"{key}: column {column!r} not in {path} (columns: {', '.join(names)})")


def require_columns(ds: Any, path: str, wanted: dict[str, str]) -> None:
    """:func:`require_column_names` for a Ray Dataset's schema."""
    require_column_names(schema_of(ds).names, path, wanted)


def _is_text_type(dtype: pa.DataType) -> bool:
    """Types a sentence column may have: strings, bytes (decoded as UTF-8), all-null."""
    if pa.types.is_dictionary(dtype):
        return _is_text_type(dtype.value_type)
    return (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_null(dtype)
        or getattr(pa.types, "is_string_view", lambda _: False)(dtype)
    )


def require_text_column(ds: Any, path: str, key: str, column: str) -> None:
    """Fail with the config key when a sentence column holds something other than text.

    Casting numbers to strings would train on ``"17"``, ``"42"``: a wrong column choice,
    not a corpus.
    """
    schema = schema_of(ds)
    dtype = dict(zip(schema.names, schema.types, strict=True)).get(column)
    if isinstance(dtype, pa.DataType) and not _is_text_type(dtype):
        raise DataError(f"{key}: column {column!r} in {path} holds {dtype}, not text (strings)")
