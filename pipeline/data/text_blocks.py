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
def _take_texts(
    picks: list[list[tuple[str, str, np.ndarray]]], bounds: np.ndarray, *blocks: pa.Table
) -> pa.Table | list[pa.Table]:
    """``(id, text)`` of the rows ``picks`` names in each of ``blocks`` (``(text column, id
    column, rows)`` each), sorted by id and cut at ``bounds`` (the first id of each range after
    the first): one table per range that holds any of them, in range order."""
    parts = [
        pa.table(
            {
                "id": block.column(ids).take(pa.array(rows)),
                "text": block.column(text).take(pa.array(rows)).cast(pa.large_string()),
            }
        )
        for block, block_picks in zip(blocks, picks, strict=True)
        for text, ids, rows in block_picks
    ]
    table = sorted_by_id(parts)
    ranges = np.searchsorted(table.column("id").to_numpy(), bounds)
    cuts = np.unique(np.concatenate([[0], ranges, [table.num_rows]]))
    pieces = [table.slice(lo, hi - lo) for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    return pieces[0] if len(pieces) == 1 else pieces


@ray.remote
def _merge_range(*pieces: pa.Table) -> pa.Table:
    """One range's pieces (each sorted by id) as one table sorted by id."""
    return sorted_by_id(list(pieces))


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
    of the corpus is the text with the ``i``-th smallest id, and the blocks are consecutive
    ranges of positions, each sorted by id: what is done to them block by block in order (the
    tokenizers) comes out in position order."""

    ids: np.ndarray
    """Sorted, distinct ids: the corpus' positions."""
    blocks: list[Any]
    """Object refs of ``(id, text)`` tables, block ``k`` holding the ``k``-th range of
    :attr:`ids`, sorted by id."""

    def __len__(self) -> int:
        return len(self.ids)

    def gather(self) -> pa.Table:
        """The whole ``(id, text)`` table on the caller, sorted by id: for what needs the texts
        as Python strings (a tokenizer trained on the corpus, the offline mining job, tests)."""
        return sorted_by_id(ray.get(self.blocks))

    def texts_at(self, positions: np.ndarray) -> list[str]:
        """The texts at corpus ``positions`` (any order, repeats allowed), as Python strings,
        fetching one block at a time: the caller holds only these texts and one block."""
        positions = np.asarray(positions, dtype=np.int64)
        wanted = self.ids[positions]
        out: list[str] = [""] * len(positions)
        order = np.argsort(wanted, kind="stable")
        ordered = wanted[order]
        for ref in self.blocks:
            block = ray.get(ref)
            ids = block.column("id").to_numpy()
            if not len(ids):
                continue
            lo, hi = np.searchsorted(ordered, ids[0], "left"), np.searchsorted(ordered, ids[-1], "right")
            if lo == hi:
                continue
            rows = np.searchsorted(ids, ordered[lo:hi])
            strings = block.column("text").take(pa.array(rows)).to_pylist()
            for at, text in zip(order[lo:hi], strings, strict=True):
                out[at] = text
            del block
        return out


RANGE_ROWS = 131_072
"""Most rows in a range of positions (a block of :class:`DistinctTexts`, and of the tokenized
corpus after it): a train worker takes its rows with one task per block, so blocks are few (30
at 4M rows), yet small beside a worker's memory."""
MAX_RANGES = 256
"""At most this many ranges (larger ones beyond 33M rows): each group of the cleaned corpus'
blocks is cut into a piece per range it touches."""

PIECE_ROWS = 4096
"""Fewest texts a block's piece of one range holds on average: blocks are taken in groups of
``ranges x PIECE_ROWS`` rows. Ray keeps a task's result under 100 KB in its owner's (the
driver's) own heap and copies it into the task that takes it; at 10M rows one block's piece of
a range is about 200 texts, and every text went through the driver's heap (450 MB more of it
at 3M rows). 4,096 texts of 60-100 bytes are kept in the object store."""
MIN_RANGE_ROWS = 1024
"""Fewest rows a range is cut to so that every CPU tokenizes (a tokenization batch)."""


def tokenizer_slots(num_cpus: float) -> int:
    """How many tokenizers of ``num_cpus`` each the cluster's CPUs run at once."""
    return int(ray.cluster_resources().get("CPU", 0) / num_cpus)


def range_count(rows: int, num_cpus: float) -> int:
    """Ranges for ``rows`` texts: at most :data:`RANGE_ROWS` rows each, and at least as many as
    the cluster runs tokenizers at once (:func:`tokenizer_slots`) while a range keeps
    :data:`MIN_RANGE_ROWS`, so a small corpus is still tokenized on every CPU."""
    wanted = max(-(-rows // RANGE_ROWS), min(tokenizer_slots(num_cpus), rows // MIN_RANGE_ROWS))
    return max(1, min(MAX_RANGES, wanted))


def distinct_texts(sources: list[TextColumns], wanted: np.ndarray, num_cpus: float) -> DistinctTexts:
    """The texts of the ``wanted`` ids, each taken once from the first block slot that holds it,
    into consecutive ranges of positions sorted by id.

    A range partition done by hand rather than Ray Data's ``sort``: the driver knows every id,
    so the ranges' bounds are exact (no sampling), a task for each group of consecutive blocks
    (:data:`PIECE_ROWS`) sorts their picks and cuts them into one piece per range they touch,
    and one task per range merges its pieces. Ray Data's sort of the tokenized corpus held up
    to 3 GB in one worker at 10M rows; these tasks hold a group of blocks or a range of texts.

    Args:
        sources: where the texts are; earlier sources and columns are taken first.
        wanted: the ids to gather (each must occur in ``sources``).
        num_cpus: CPUs each task reserves (``data.tokenize_num_cpus``).
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
    picked = first[at]  # the slot of each position
    del found, first, at
    ranges = range_count(len(wanted), num_cpus)
    per_range = -(-len(wanted) // ranges) if len(wanted) else 1
    bounds = wanted[per_range::per_range]
    order = np.argsort(picked)
    picked = picked[order]
    range_of = np.floor_divide(order, per_range, out=order).astype(np.int32)  # each slot's range
    del order
    pieces: list[list[Any]] = [[] for _ in range(len(bounds) + 1)]
    start = 0
    for source in sources:
        rows = int(source.block_rows.sum())
        block_starts = np.concatenate([[0], np.cumsum(source.block_rows)])
        picks: dict[int, list[tuple[str, str, np.ndarray]]] = {}
        touched: dict[int, set[int]] = {}
        for text, ids in source.columns:
            lo, hi = np.searchsorted(picked, [start, start + rows])
            at = picked[lo:hi] - start  # sorted: each block's rows are one slice of it
            bounds_at = np.searchsorted(at, block_starts)
            for b in np.flatnonzero(np.diff(bounds_at)):
                first_pick, end_pick = bounds_at[b], bounds_at[b + 1]
                picks.setdefault(int(b), []).append((text, ids, at[first_pick:end_pick] - block_starts[b]))
                touched.setdefault(int(b), set()).update(
                    np.unique(range_of[lo + first_pick : lo + end_pick]).tolist()
                )
            start += rows
        for group in _block_groups(picks, rows_per_group=ranges * PIECE_ROWS):
            in_ranges = sorted(set().union(*(touched[b] for b in group)))
            take = _take_texts.options(num_cpus=num_cpus, num_returns=len(in_ranges))
            refs = take.remote([picks[b] for b in group], bounds, *(source.blocks[b] for b in group))
            for k, ref in zip(in_ranges, refs if len(in_ranges) > 1 else [refs], strict=True):
                pieces[k].append(ref)
    merge = _merge_range.options(num_cpus=num_cpus)
    return DistinctTexts(wanted, [merge.remote(*range_pieces) for range_pieces in pieces if range_pieces])


def _block_groups(
    picks: dict[int, list[tuple[str, str, np.ndarray]]], *, rows_per_group: int
) -> list[list[int]]:
    """Consecutive blocks (of those ``picks`` names) in groups of at least ``rows_per_group``
    picked rows (the last group may hold fewer): one taking task a group."""
    groups: list[list[int]] = [[]]
    rows = 0
    for b in sorted(picks):
        if rows >= rows_per_group:
            groups.append([])
            rows = 0
        groups[-1].append(b)
        rows += sum(len(block_rows) for _, _, block_rows in picks[b])
    return groups if groups[0] else []
