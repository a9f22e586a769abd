"""Supervised rows read with Ray Data: (anchor, positive[, negative]) pairs from columns,
labelled rows or headerless pair files, and the optional candidate pool (``data.pool``),
then indexed as :class:`~pipeline.data.triplets.Triplets` (:func:`index_pairs`).

The texts stay in the object store (:mod:`pipeline.data.text_blocks`): a Ray Data stage cleans
and hashes them, the driver decides on their ids, and only the distinct texts are taken out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config.data_section import DataSection
from pipeline.core.distinct import sorted_distinct
from pipeline.core.errors import DataError
from pipeline.data.columns import corpus_columns, pair_columns, require_columns, require_text_column
from pipeline.data.delimited import require_pairs_tsv_fields
from pipeline.data.formats import infer_format
from pipeline.data.pair_labels import label_codes, require_labels, round_robin_negatives
from pipeline.data.placement import ANYWHERE, ReadNodes
from pipeline.data.read_failures import passing_read_failures, schema_of
from pipeline.data.readers import read_dataset, reading
from pipeline.data.text_blocks import (
    DistinctTexts,
    TextColumns,
    block_columns,
    distinct_texts,
    materialized_blocks,
)
from pipeline.data.triplets import Triplets, triplets_from_ids
from pipeline.data.utf8 import _as_text, text_ids


def _clean_text(column: Any) -> Any:
    """Stripped strings; a cell that is not UTF-8 becomes empty, so its row is dropped."""
    text, _ = _as_text(column)
    return pc.utf8_trim_whitespace(pc.fill_null(text, ""))


@passing_read_failures
def _clean_pairs(
    batch: pa.Table, *, anchor: str, positive: str, negative: str | None, label: str | None
) -> pa.Table:
    """Ray Data stage: a block of the file as cleaned texts and their ids (``anchor``,
    ``positive``[, ``negative``] and ``*_id``, -1 for an empty text) and, with labels,
    :func:`~pipeline.data.pair_labels.label_codes` (``label``, ``label_other``)."""
    columns: dict[str, Any] = {}
    for name, source in (("anchor", anchor), ("positive", positive), ("negative", negative)):
        if source is not None:
            text = _clean_text(batch.column(source))
            columns[name], columns[f"{name}_id"] = text, text_ids(text)
    if label is not None:
        codes, columns["label_other"] = label_codes(batch.column(label))
        columns["label"] = pa.array(codes)
    return pa.table(columns)


@passing_read_failures
def _clean_pool(batch: pa.Table, *, column: str) -> pa.Table:
    text = _clean_text(batch.column(column))
    return pa.table({"text": text, "id": text_ids(text)})


@dataclass
class PairRows:
    """A pair input as read (:func:`load_pairs`): the (anchor, positive) rows in file order as
    text ids, their given negatives, the candidate pool, and what was left out. The texts
    stay in the object store (:attr:`sources`)."""

    anchors: np.ndarray
    """Text id of each row's anchor (:func:`~pipeline.data.utf8.stable_row_id`)."""
    positives: np.ndarray
    negatives: np.ndarray | None
    """Given negative's id per row (-1: none for that row); None when the input gives none or
    ``data.given_negatives`` is false."""
    rows_read: int
    """Rows in the file, whatever their label."""
    sources: list[TextColumns]
    """Where the texts are: the file's cleaned blocks, then the pool's."""
    empty_dropped: int = 0
    """Rows with an empty (or not UTF-8) first or second text, dropped whatever their label."""
    negative_rows: int = 0
    """Label-0 rows (non-empty): the given negatives of their anchors, or left out when
    ``data.given_negatives`` is false."""
    beyond_max_rows: int = 0
    """(anchor, positive) rows after the first ``data.max_rows``, not trained on."""
    pool: np.ndarray | None = None
    """The distinct text ids of ``data.pool``; None when unset."""

    def __len__(self) -> int:
        return len(self.anchors)

    @property
    def given(self) -> int:
        """Rows with a given negative."""
        return 0 if self.negatives is None else int((self.negatives >= 0).sum())

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


def _read_columns(section: DataSection, fmt: str, ds: Any) -> tuple[dict[str, str | None], str]:
    """The file's column of each role (anchor, positive, negative, label), after checking that
    they are there, and the key a bad label is reported under."""
    assert section.path is not None
    if fmt == "text":
        return {"anchor": "text", "positive": "text", "negative": None, "label": None}, "data.label_column"
    if fmt == "pairs_tsv":
        names = schema_of(ds).names
        require_pairs_tsv_fields(names, section.path, "data.path")
        label = "label" if "label" in names else None
        return {"anchor": "sentence1", "positive": "sentence2", "negative": None, "label": label}, "data.path"
    columns = pair_columns(section)
    require_columns(ds, section.path, columns)
    for key, column in columns.items():
        if key != "data.label_column":
            require_text_column(ds, section.path, key, column)
    roles = {
        "anchor": section.anchor_column,
        "positive": section.positive_column,
        "negative": columns.get("data.negative_column"),
        "label": section.label_column,
    }
    return roles, "data.label_column"


def load_pairs(section: DataSection, *, reads: ReadNodes = ANYWHERE) -> PairRows:
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
    (anchor, positive) rows. ``reads``: which files are read on one node only (the one whose
    disk holds them).

    Raises:
        DataError: one line naming the key and the file: unreadable, a missing column, a
            label other than 0 and 1, no label-1 row, no pair left.
    """
    assert section.path is not None
    fmt = infer_format(section.path, section.format)
    with reading(section.path, fmt):
        text_columns = [c for key, c in pair_columns(section).items() if key != "data.label_column"]
        ds = read_dataset(section.path, fmt, text_columns=text_columns, reads=reads)
        roles, label_key = _read_columns(section, fmt, ds)
        if not section.given_negatives:
            roles["negative"] = None
        blocks = materialized_blocks(
            ds.map_batches(
                _clean_pairs, batch_format="pyarrow", fn_kwargs=roles, num_cpus=section.tokenize_num_cpus
            )
        )
        names = ["anchor_id", "positive_id"] + (["negative_id"] if roles["negative"] else [])
        names += ["label", "label_other"] if roles["label"] else []
        read, block_rows = block_columns(blocks, names, section.tokenize_num_cpus)
    anchors, seconds = read.column("anchor_id").to_numpy(), read.column("positive_id").to_numpy()
    rows_read = len(anchors)
    keep = (anchors >= 0) & (seconds >= 0)
    positive = np.ones(rows_read, dtype=bool)
    if roles["label"]:
        positive = require_labels(
            read.column("label").to_numpy(), read.column("label_other"), section.path, label_key
        )
        if not positive.any():
            raise DataError(
                f"{label_key}: {section.path} has no row labelled 1 (a pair to train on) among its "
                f"{rows_read} rows"
            )
    pair_rows = keep & positive
    if not pair_rows.any():
        raise DataError(f"data.path: {section.path} has no non-empty (anchor, positive) pairs")
    negatives = None
    if roles["negative"]:
        negatives = read.column("negative_id").to_numpy()[pair_rows]
    elif roles["label"] and section.given_negatives:
        label_zero = keep & ~positive
        negatives = round_robin_negatives(
            anchors[pair_rows], seconds[pair_rows], anchors[label_zero], seconds[label_zero]
        )
    anchor_ids, positive_ids = anchors[pair_rows], seconds[pair_rows]
    beyond = 0
    if section.max_rows is not None and len(anchor_ids) > section.max_rows:  # pair files keep their order
        beyond = len(anchor_ids) - section.max_rows
        anchor_ids, positive_ids = anchor_ids[: section.max_rows], positive_ids[: section.max_rows]
        negatives = negatives[: section.max_rows] if negatives is not None else None
    text_roles = [(role, f"{role}_id") for role in ("anchor", "positive", "negative") if roles[role]]
    ids = [read.column(f"{role}_id").to_numpy() for role, _ in text_roles]
    sources = [TextColumns(blocks, text_roles, ids, block_rows)]
    pool = None
    if section.pool is not None:
        pool_source = read_pool(section, reads=reads)
        sources.append(pool_source)
        pool = sorted_distinct(pool_source.ids[0][pool_source.ids[0] >= 0])
    return PairRows(
        anchor_ids,
        positive_ids,
        negatives,
        rows_read,
        sources,
        empty_dropped=int((~keep).sum()),
        negative_rows=int((keep & ~positive).sum()),
        beyond_max_rows=beyond,
        pool=pool,
    )


def read_pool(section: DataSection, *, reads: ReadNodes = ANYWHERE) -> TextColumns:
    """The non-empty texts of ``data.pool`` as cleaned blocks and their ids: lines of a text
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
        ds = read_dataset(path, fmt, text_columns=list(columns.values()), reads=reads)
        if fmt == "text":
            column = "text"
        elif fmt == "pairs_tsv":
            require_pairs_tsv_fields(schema_of(ds).names, path, "data.pool")
            column = "sentence2"
        else:
            require_columns(ds, path, columns)
            require_text_column(ds, path, "data.text_column", section.text_column)
            column = section.text_column
        blocks = materialized_blocks(
            ds.map_batches(
                _clean_pool,
                batch_format="pyarrow",
                fn_kwargs={"column": column},
                num_cpus=section.tokenize_num_cpus,
            )
        )
        read, block_rows = block_columns(blocks, ["id"], section.tokenize_num_cpus)
    ids = read.column("id").to_numpy()
    if not (ids >= 0).any():
        raise DataError(f"data.pool: {path} has no non-empty texts")
    return TextColumns(blocks, [("text", "id")], [ids], block_rows)


def index_pairs(rows: PairRows, num_cpus: float = 1) -> tuple[DistinctTexts, Triplets]:
    """The rows as :class:`~pipeline.data.triplets.Triplets` over the distinct texts they name
    (the pool's included), which are taken out of the read blocks (``num_cpus`` a task:
    ``data.tokenize_num_cpus``) and stay in the object store."""
    ids, triplets = triplets_from_ids(rows.anchors, rows.positives, rows.negatives, rows.pool)
    return distinct_texts(rows.sources, ids, num_cpus), triplets


def pair_texts(
    rows: PairRows, texts: DistinctTexts, triplets: Triplets
) -> tuple[list[str], list[str], list[str] | None, list[str] | None]:
    """``(anchors, positives, negatives, pool)`` of :func:`load_pairs` as Python lists on the
    caller (a negative ``""`` where a row has none), from what :func:`index_pairs` made of
    ``rows``: for tests (:func:`read_pairs`)."""
    strings = texts.gather().column("text").to_pylist()

    def at(positions: np.ndarray) -> list[str]:
        return [strings[p] if p >= 0 else "" for p in positions.tolist()]

    pool = (
        sorted(strings[p] for p in np.searchsorted(texts.ids, rows.pool)) if rows.pool is not None else None
    )
    negatives = at(triplets.negative) if rows.negatives is not None else None
    return at(triplets.anchor), at(triplets.positive), negatives, pool


def read_pairs(section: DataSection) -> tuple[list[str], list[str], list[str] | None, int]:
    """``(anchors, positives, negatives, rows read)`` of :func:`load_pairs` as Python lists;
    for small files and tests."""
    rows = load_pairs(section)
    anchors, positives, negatives, _ = pair_texts(rows, *index_pairs(rows))
    return anchors, positives, negatives, rows.rows_read
