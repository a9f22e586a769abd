"""Texts that stay in the object store: the blocks a Ray Data stage cleaned, the driver holding
only their 64-bit ids, and each distinct text taken once out of the block that holds it.

A 10-million-row file never becomes 10 million strings on the driver. The cleaning stage hashes
each text where it cleans it (:func:`~pipeline.data.utf8.stable_row_id`); the driver decides on
the ids alone (which rows are kept, which text is which row's anchor, which texts are
distinct); then one task per block takes the distinct texts out of that block.

Ids are content hashes, so two texts are one text here exactly when their 63-bit hashes are
equal: among 10M distinct texts, some pair collides with a chance of about 1 in 200,000
(n^2 / 2^64).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from pipeline.core.distinct import first_occurrences, sorted_distinct
from pipeline.data.read_failures import READ_FAILURE, raise_read_failure
from pipeline.data.tokenized import sorted_by_id


@ray.remote
def _select(block: pa.Table, columns: list[str]) -> pa.Table:
    # A failed read's block may hold the rows read before the failure: only the failure
    # travels to the driver, not their texts.
    return block.select([READ_FAILURE] if READ_FAILURE in block.column_names else columns)


@ray.remote
def _take_texts(block: pa.Table, picks: list[tuple[str, str, np.ndarray]]) -> pa.Table:
    """``(id, text)`` of the rows ``picks`` names: ``(text column, id column, rows)`` each."""
    parts = [
        pa.table(
            {
                "id": block.column(ids).take(pa.array(rows)),
                "text": block.column(text).take(pa.array(rows)).cast(pa.string()),
            }
        )
        for text, ids, rows in picks
    ]
    return pa.concat_tables(parts).combine_chunks()


def materialized_blocks(ds: Any) -> list[Any]:
    """Run ``ds`` and keep its output in the object store: the refs of its blocks, in the
    input's order (row order is meaning: ``data.max_rows`` keeps the first rows, a label-0
    row's negative goes to its anchor's rows in turn, and an error names a row by number)."""
    # The flag is this dataset's own context (a dataset copies the current one), not the job's.
    ds.context.execution_options.preserve_order = True
    return list(ds.materialize().to_arrow_refs())


def block_columns(blocks: list[Any], columns: list[str], num_cpus: float) -> tuple[pa.Table, np.ndarray]:
    """The named (small: ids, flags) columns of every block, concatenated on the driver in
    block order, and the rows of each block; the texts stay where they are.

    Raises:
        ReadFailed: a block is a failed read's (:mod:`~pipeline.data.read_failures`).
    """
    tables = ray.get([_select.options(num_cpus=num_cpus).remote(b, columns) for b in blocks])
    raise_read_failure(tables)
    rows = np.array([t.num_rows for t in tables], dtype=np.int64)
    if not tables:
        return pa.table({c: pa.array([], pa.int64()) for c in columns}), rows
    return pa.concat_tables(tables).combine_chunks(), rows


@ray.remote
def _column_sums(block: pa.Table, columns: list[str]) -> dict[str, int]:
    return {c: int(pc.sum(block.column(c)).as_py() or 0) for c in columns}


def column_totals(blocks: list[Any], columns: list[str], num_cpus: float) -> dict[str, int]:
    """The sum of each named (numeric or bool) column over every block, summed where the
    blocks are: counts a row of which the driver needs only the total."""
    totals = dict.fromkeys(columns, 0)
    for sums in ray.get([_column_sums.options(num_cpus=num_cpus).remote(b, columns) for b in blocks]):
        for column, value in sums.items():
            totals[column] += value
    return totals


@dataclass(frozen=True)
class TextColumns:
    """Text columns of blocks in the object store, with the ids the driver holds for them."""

    blocks: list[Any]
    """Object refs of the blocks (Arrow tables), in file order."""
    columns: list[tuple[str, str]]
    """``(text column, id column)`` pairs of each block."""
    ids: list[np.ndarray]
    """Per pair of ``columns``: the id of every row of every block, in block order (-1: no text)."""
    block_rows: np.ndarray = field(repr=False)
    """Rows of each block."""


@dataclass(frozen=True)
class DistinctTexts:
    """Each distinct text once, as ``(id, text)`` blocks in the object store; position ``i``
    of the corpus is the text with the ``i``-th smallest id."""

    ids: np.ndarray
    """Sorted, distinct ids: the corpus' positions."""
    blocks: list[Any]
    """Object refs of ``(id, text)`` tables, together holding each id of :attr:`ids` once."""

    def __len__(self) -> int:
        return len(self.ids)

    def gather(self) -> pa.Table:
        """The whole ``(id, text)`` table on the caller, sorted by id: for what needs the texts
        as Python strings (a tokenizer trained on the corpus, the offline mining job, tests)."""
        return sorted_by_id(ray.get(self.blocks))


def distinct_texts(sources: list[TextColumns], wanted: np.ndarray, num_cpus: float) -> DistinctTexts:
    """The texts of the ``wanted`` ids, each taken once from the first block slot that holds it.

    Args:
        sources: where the texts are; earlier sources and columns are taken first.
        wanted: the ids to gather (each must occur in ``sources``).
        num_cpus: CPUs each taking task reserves (``data.tokenize_num_cpus``).
    """
    if len(wanted) > 1 and not (wanted[1:] > wanted[:-1]).all():
        wanted = sorted_distinct(wanted)
    every = [ids for source in sources for ids in source.ids]
    flat = every[0] if len(every) == 1 else np.concatenate(every or [np.empty(0, np.int64)])
    found, first = first_occurrences(flat)
    del flat, every
    at = np.searchsorted(found, wanted).clip(max=max(len(found) - 1, 0))
    missing = int((found[at] != wanted).sum()) if len(found) else len(wanted)
    if missing:
        raise RuntimeError(f"{missing} of the wanted texts are in no block")
    picked = first[at]
    del found, first, at
    picked.sort()
    blocks: list[Any] = []
    start = 0
    for source in sources:
        rows = int(source.block_rows.sum())
        block_starts = np.concatenate([[0], np.cumsum(source.block_rows)])
        picks: dict[int, list[tuple[str, str, np.ndarray]]] = {}
        for text, ids in source.columns:
            lo, hi = np.searchsorted(picked, [start, start + rows])
            at = picked[lo:hi] - start  # sorted: each block's rows are one slice of it
            bounds = np.searchsorted(at, block_starts)
            for b in np.flatnonzero(np.diff(bounds)):
                picks.setdefault(int(b), []).append(
                    (text, ids, at[bounds[b] : bounds[b + 1]] - block_starts[b])
                )
            start += rows
        blocks += [
            _take_texts.options(num_cpus=num_cpus).remote(source.blocks[b], picks[b]) for b in sorted(picks)
        ]
    return DistinctTexts(wanted, blocks)
