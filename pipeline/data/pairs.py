"""Supervised rows read with Ray Data: (anchor, positive[, negative]) pairs from columns,
labelled rows or headerless pair files, and the optional candidate pool (``data.pool``),
then indexed as :class:`~pipeline.data.triplets.Triplets` (:func:`index_pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.columns import corpus_columns, pair_columns, require_columns, require_text_column
from pipeline.data.delimited import require_pairs_tsv_fields
from pipeline.data.formats import infer_format
from pipeline.data.pair_labels import label_is_positive, round_robin_negatives
from pipeline.data.readers import read_dataset, reading
from pipeline.data.triplets import Triplets, index_triplets, one_array
from pipeline.data.utf8 import _as_text


def _clean_text(column: Any) -> Any:
    """Stripped strings; a cell that is not UTF-8 becomes empty, so its row is dropped."""
    text, _ = _as_text(column)
    return pc.utf8_trim_whitespace(pc.fill_null(text, ""))


def _non_empty(column: Any) -> np.ndarray:
    return pc.greater(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)


def _table(ds: Any, columns: list[str]) -> pa.Table:
    """The dataset's ``columns`` as one Arrow table, in the file's row order."""
    ds = ds.select_columns(columns)
    # Row order is meaning here (a label-0 row's negative goes to its anchor's rows in turn,
    # data.max_rows keeps the first rows), and Ray Data hands blocks back in the order they
    # finish unless asked: under load a later block overtook an earlier one. The flag is on
    # this read's own context (a read copies the current one), not the job's.
    ds.context.execution_options.preserve_order = True
    tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    if not tables:
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    return pa.concat_tables(tables)


@dataclass
class PairRows:
    """A pair input as read (:func:`load_pairs`): the (anchor, positive) rows in file order,
    their given negatives, the candidate pool, and what was left out."""

    anchors: pa.Array
    """Arrow strings, one per row: a large file never becomes Python strings on the driver."""
    positives: pa.Array
    negatives: pa.Array | None
    """Given negative per row (``""``: none for that row); None when the input gives none or
    ``data.given_negatives`` is false."""
    rows_read: int
    """Rows in the file, whatever their label."""
    empty_dropped: int = 0
    """Rows with an empty (or not UTF-8) first or second text, dropped whatever their label."""
    negative_rows: int = 0
    """Label-0 rows (non-empty): the given negatives of their anchors, or left out when
    ``data.given_negatives`` is false."""
    beyond_max_rows: int = 0
    """(anchor, positive) rows after the first ``data.max_rows``, not trained on."""
    pool: pa.Array | None = None
    """The distinct texts of ``data.pool``; None when unset."""

    def __len__(self) -> int:
        return len(self.anchors)

    @property
    def given(self) -> int:
        """Rows with a given negative."""
        if self.negatives is None:
            return 0
        return int(pc.sum(pc.greater(pc.utf8_length(self.negatives), 0)).as_py() or 0)

    def describe(self) -> str:
        """``7710 (anchor, positive) rows of 30993 read (23283 labelled 0, ...), 7710 with a
        given negative``: the reading half of the ``[data]`` line."""
        left = [f"{self.negative_rows} labelled 0"] if self.negative_rows else []
        left.append(f"{self.empty_dropped} with an empty field dropped")
        if self.beyond_max_rows:
            left.append(f"{self.beyond_max_rows} beyond data.max_rows")
        return (
            f"{len(self)} (anchor, positive) rows of {self.rows_read} read ({', '.join(left)}), "
            f"{self.given} with a given negative"
        )


def load_pairs(section: DataSection) -> PairRows:
    """Read ``data.path`` as (anchor, positive) rows, and ``data.pool`` when set.

    - A text file gives each sentence as its own positive.
    - ``pairs_tsv`` (headerless, tab-separated, unquoted): fields sentence1, sentence2 and an
      optional label.
    - csv/tsv/jsonl/parquet: ``data.anchor_column`` / ``data.positive_column``, and
      ``data.label_column`` or ``data.negative_column`` when set.

    With labels, label-1 rows are the (anchor, positive) rows and the second texts of label-0
    rows are given negatives of their anchor (:func:`~pipeline.data.pair_labels.round_robin_negatives`).
    Texts are stripped; a row with an empty first or second text is dropped. ``data.given_negatives``
    false leaves label-0 rows and the negative column out. ``data.max_rows`` keeps the first
    (anchor, positive) rows.

    Raises:
        DataError: one line naming the key and the file: unreadable, a missing column, a
            label other than 0 and 1, no label-1 row, no pair left.
    """
    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    columns = pair_columns(section)
    labels = column_negatives = None
    label_key = "data.label_column"
    with reading(section.path, fmt):
        text_columns = [c for key, c in columns.items() if key != "data.label_column"]
        ds = read_dataset(section.path, fmt, text_columns=text_columns)
        if fmt == "text":
            anchors = seconds = _clean_text(_table(ds, ["text"]).column("text"))  # not UTF-8: empty
        elif fmt == "pairs_tsv":
            names = ds.schema().names
            require_pairs_tsv_fields(names, section.path, "data.path")
            table = _table(ds, names)
            anchors, seconds = _clean_text(table.column("sentence1")), _clean_text(table.column("sentence2"))
            labels = table.column("label") if "label" in names else None
            label_key = "data.path"
        else:
            require_columns(ds, section.path, columns)
            for key, column in columns.items():
                if key != "data.label_column":
                    require_text_column(ds, section.path, key, column)
            table = _table(ds, list(dict.fromkeys(columns.values())))
            anchors = _clean_text(table.column(section.anchor_column))
            seconds = _clean_text(table.column(section.positive_column))
            labels = table.column(section.label_column) if section.label_column else None
            if "data.negative_column" in columns:
                column_negatives = _clean_text(table.column(columns["data.negative_column"]))
    rows_read = len(anchors)
    keep = _non_empty(anchors) & _non_empty(seconds)
    positive = np.ones(rows_read, dtype=bool)
    if labels is not None:
        positive = label_is_positive(labels, section.path, label_key)
        if not positive.any():
            raise DataError(
                f"{label_key}: {section.path} has no row labelled 1 (a pair to train on) among its "
                f"{rows_read} rows"
            )
    pair_rows = pa.array(keep & positive)
    anchor_texts = one_array(pc.filter(anchors, pair_rows))
    if not len(anchor_texts):
        raise DataError(f"data.path: {section.path} has no non-empty (anchor, positive) pairs")
    positive_texts = one_array(pc.filter(seconds, pair_rows))
    negative_rows = int((keep & ~positive).sum())
    negative_texts = None
    if column_negatives is not None:
        negative_texts = one_array(pc.filter(column_negatives, pair_rows))
    elif labels is not None and section.given_negatives:
        # Per-anchor bookkeeping in Python: labelled files are the annotated corpora (tens of
        # thousands of rows), not the web-scale pair files.
        negative_rows_mask = pa.array(keep & ~positive)
        dealt = round_robin_negatives(
            anchor_texts.to_pylist(),
            positive_texts.to_pylist(),
            pc.filter(anchors, negative_rows_mask).to_pylist(),
            pc.filter(seconds, negative_rows_mask).to_pylist(),
        )
        negative_texts = pa.array(dealt, pa.string())
    beyond = 0
    if section.max_rows is not None and len(anchor_texts) > section.max_rows:  # pair files keep their order
        beyond = len(anchor_texts) - section.max_rows
        anchor_texts, positive_texts = anchor_texts[: section.max_rows], positive_texts[: section.max_rows]
        negative_texts = negative_texts[: section.max_rows] if negative_texts is not None else None
    return PairRows(
        anchor_texts,
        positive_texts,
        negative_texts,
        rows_read,
        empty_dropped=int((~keep).sum()),
        negative_rows=negative_rows,
        beyond_max_rows=beyond,
        pool=read_pool(section) if section.pool is not None else None,
    )


def read_pairs(section: DataSection) -> tuple[list[str], list[str], list[str] | None, int]:
    """``(anchors, positives, negatives, rows read)`` of :func:`load_pairs` as Python lists
    (which also gives the candidate pool and the counts); for small files and tests."""
    rows = load_pairs(section)
    negatives = rows.negatives.to_pylist() if rows.negatives is not None else None
    return rows.anchors.to_pylist(), rows.positives.to_pylist(), negatives, rows.rows_read


def read_pool(section: DataSection) -> pa.Array:
    """The distinct non-empty texts of ``data.pool`` in first-seen order: lines of a text
    file, ``data.text_column`` of a csv/tsv/jsonl/parquet file, every sentence2 of a
    ``pairs_tsv`` file.

    Raises:
        DataError: naming ``data.pool`` (unreadable, no text) or ``data.text_column``.
    """
    path = section.pool
    assert path is not None
    fmt = infer_format(path, section.pool_format, key="data.pool_format")
    columns = corpus_columns(section)
    with reading(path, fmt, key="data.pool"):
        ds = read_dataset(path, fmt, text_columns=list(columns.values()))
        if fmt == "text":
            texts = _table(ds, ["text"]).column("text")
        elif fmt == "pairs_tsv":
            require_pairs_tsv_fields(ds.schema().names, path, "data.pool")
            texts = _table(ds, ["sentence2"]).column("sentence2")
        else:
            require_columns(ds, path, columns)
            require_text_column(ds, path, "data.text_column", section.text_column)
            texts = _table(ds, [section.text_column]).column(section.text_column)
    cleaned = _clean_text(texts)
    distinct = one_array(pc.unique(pc.filter(cleaned, pa.array(_non_empty(cleaned)))))
    if not len(distinct):
        raise DataError(f"data.pool: {path} has no non-empty texts")
    return distinct


def index_pairs(rows: PairRows) -> tuple[pa.Table, Triplets]:
    """:func:`~pipeline.data.triplets.index_triplets` of what :func:`load_pairs` read, the pool
    included."""
    return index_triplets(rows.anchors, rows.positives, rows.negatives, rows.pool)
