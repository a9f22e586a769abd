"""Supervised rows as positions into one de-duplicated table of texts (:class:`Triplets`), so
each text is tokenized and encoded once however often it occurs.

No reading here: the train step, the miner and the tokenized corpus import this without the
Ray Data readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.core.distinct import sorted_distinct
from pipeline.data.utf8 import text_ids


@dataclass
class Triplets:
    """Supervised rows as positions into one de-duplicated text corpus."""

    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    """Given negative per row, -1 where none."""
    pool: np.ndarray | None = None
    """Positions of the candidate texts mining searches (``data.pool``: a separate corpus whose
    texts were added to the table, with the distinct positives, as sentence-transformers'
    ``mine_hard_negatives(corpus=...)`` adds them); None: the distinct positives."""

    def __len__(self) -> int:
        return len(self.anchor)

    @property
    def has_given_negatives(self) -> bool:
        """Whether any row carries a given negative."""
        return bool((self.negative >= 0).any())

    def row_texts(self) -> np.ndarray:
        """``(n, 3)`` each row's anchor, positive and given negative (-1: none) positions."""
        return np.stack([self.anchor, self.positive, self.negative], axis=1)

    def candidate_pool(self) -> np.ndarray:
        """Sorted, distinct positions of the texts negatives are mined from."""
        return sorted_distinct(self.pool if self.pool is not None else self.positive)


def one_array(texts: Any) -> pa.Array:
    """One contiguous Arrow array of a (chunked) column; a list becomes one."""
    if isinstance(texts, list):
        return pa.array(texts, pa.large_string())
    if isinstance(texts, pa.ChunkedArray):
        return texts.combine_chunks() if texts.num_chunks else pa.array([], texts.type)
    return texts


def _strings(texts: Any) -> pa.Array:
    """``texts`` as one Arrow large_string array (64-bit offsets: a column of many long texts
    may pass 2 GiB)."""
    return one_array(texts).cast(pa.large_string())


def triplets_from_ids(
    anchor: np.ndarray,
    positive: np.ndarray,
    negative: np.ndarray | None = None,
    pool: np.ndarray | None = None,
) -> tuple[np.ndarray, Triplets]:
    """The rows as positions into the sorted distinct ids of every text they name.

    Args:
        anchor, positive: ``(n,)`` text ids (:func:`~pipeline.data.utf8.stable_row_id`) of each row.
        negative: ``(n,)`` the given negative's id, -1 where a row has none; None: no row has one.
        pool: ids of the candidate texts mining searches (``data.pool``); None: the positives.

    Returns:
        ``(ids, triplets)``: ``ids`` sorted and distinct (position ``i`` is ``ids[i]``'s text),
        and the rows as positions in it.
    """
    parts = [anchor, positive]
    if negative is not None:
        parts.append(negative[negative >= 0])
    if pool is not None:
        parts.append(pool)
    ids = sorted_distinct(np.concatenate(parts))

    def positions(column: np.ndarray) -> np.ndarray:
        return np.where(column >= 0, np.searchsorted(ids, column), -1).astype(np.int64)

    positive_at = positions(positive)
    triplets = Triplets(
        positions(anchor),
        positive_at,
        positions(negative) if negative is not None else np.full(len(positive_at), -1, dtype=np.int64),
        pool=sorted_distinct(np.concatenate([positions(pool), positive_at])) if pool is not None else None,
    )
    return ids, triplets


def index_triplets(
    anchors: Any,
    positives: Any,
    negatives: Any | None,
    pool: Any | None = None,
) -> tuple[pa.Table, Triplets]:
    """:func:`triplets_from_ids` of texts held in memory (Arrow arrays or lists), with the
    ``(id, text)`` table of every distinct text, sorted by id. ``negatives``: one given
    negative per row, ``""`` where a row has none. For small inputs and tests: a job's data
    is indexed where it was read (:mod:`pipeline.data.pairs`)."""
    columns = [_strings(t) if t is not None else None for t in (anchors, positives, negatives, pool)]
    ids = [text_ids(t) if t is not None else None for t in columns]  # an empty negative: -1, none
    distinct, triplets = triplets_from_ids(*ids)
    every = pa.concat_arrays([t for t in columns if t is not None])
    every_ids = np.concatenate([i for i in ids if i is not None])
    _, first = np.unique(every_ids, return_index=True)
    found = every_ids[first]
    texts = every.take(pa.array(first[np.isin(found, distinct)]))
    return pa.table({"id": distinct, "text": texts.cast(pa.large_string())}), triplets
