"""Supervised rows: (anchor, positive[, negative]) columns, indexed into one table of
distinct texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config.sections import DataSection
from pipeline.data.readers import (
    DataError,
    infer_format,
    pair_columns,
    read_dataset,
    reading,
    require_columns,
    require_text_column,
)
from pipeline.data.utf8 import _as_text, stable_row_id


def _clean_text(column: Any) -> Any:
    """Stripped strings; a cell that is not UTF-8 becomes empty, so its row is dropped."""
    text, _ = _as_text(column)
    return pc.utf8_trim_whitespace(pc.fill_null(text, ""))


def read_pairs(section: DataSection) -> tuple[list[str], list[str], list[str] | None, int]:
    """``(anchors, positives, negatives, rows read)``, stripped, rows with an empty anchor or
    positive dropped.

    A text file gives each sentence as its own positive. Pair files use
    ``data.anchor_column`` / ``data.positive_column``, and ``data.negative_column`` when set
    (an empty cell: no given negative for that row; ``negatives`` is None when unset).
    """
    import ray

    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    columns = pair_columns(section)
    negatives = None
    with reading(section.path, fmt):
        ds = read_dataset(section.path, fmt, text_columns=list(columns.values()))
        if fmt == "text":
            tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
            text = pa.concat_tables(tables).column("text") if tables else pa.array([], pa.string())
            anchors = positives = _clean_text(text)  # lines that are not UTF-8 are empty here
        else:
            require_columns(ds, section.path, columns)
            for key, column in columns.items():
                require_text_column(ds, section.path, key, column)
            wanted = list(dict.fromkeys(columns.values()))
            table = pa.concat_tables(ray.get(ds.select_columns(wanted).to_arrow_refs()))
            anchors = _clean_text(table.column(section.anchor_column))
            positives = _clean_text(table.column(section.positive_column))
            if section.negative_column:
                negatives = _clean_text(table.column(section.negative_column))
    keep = pc.and_(pc.greater(pc.utf8_length(anchors), 0), pc.greater(pc.utf8_length(positives), 0))
    rows = len(anchors)
    anchors_list = pc.filter(anchors, keep).to_pylist()
    if not anchors_list:
        raise DataError(f"data.path: {section.path} has no non-empty (anchor, positive) pairs")
    positives_list = pc.filter(positives, keep).to_pylist()
    negatives_list = pc.filter(negatives, keep).to_pylist() if negatives is not None else None
    if section.max_rows is not None:  # the first rows: pair files keep their own order
        anchors_list, positives_list = anchors_list[: section.max_rows], positives_list[: section.max_rows]
        negatives_list = negatives_list[: section.max_rows] if negatives_list is not None else None
    return anchors_list, positives_list, negatives_list, rows


@dataclass
class Triplets:
    """Supervised rows as positions into one de-duplicated text corpus."""

    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    """Given negative per row, -1 where none."""

    def __len__(self) -> int:
        return len(self.anchor)


def index_triplets(
    anchors: list[str], positives: list[str], negatives: list[str] | None
) -> tuple[pa.Table, Triplets]:
    """One ``(id, text)`` table of every distinct text, sorted by id, and the rows as positions
    in it: each text is tokenized and encoded once however often it occurs."""
    texts = set(anchors) | set(positives) | ({t for t in negatives if t} if negatives else set())
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    text_list = list(texts)
    order = np.argsort(ids)
    table = pa.table({"id": ids[order], "text": [text_list[i] for i in order]})
    position = {text_list[i]: rank for rank, i in enumerate(order.tolist())}
    negative = (
        np.array([position[t] if t else -1 for t in negatives], dtype=np.int64)
        if negatives is not None
        else np.full(len(anchors), -1, dtype=np.int64)
    )
    triplets = Triplets(
        np.array([position[t] for t in anchors], dtype=np.int64),
        np.array([position[t] for t in positives], dtype=np.int64),
        negative,
    )
    return table, triplets
