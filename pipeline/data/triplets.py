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
import pyarrow.compute as pc

from pipeline.data.utf8 import stable_row_id


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

    def candidate_pool(self) -> np.ndarray:
        """Sorted, distinct positions of the texts negatives are mined from."""
        return np.unique(self.pool if self.pool is not None else self.positive)


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


def text_ids(texts: pa.Array, chunk: int = 65_536) -> np.ndarray:
    """:func:`~pipeline.data.utf8.stable_row_id` of each text, a chunk of Python strings at a
    time (never all of them at once)."""
    ids = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), chunk):
        part = texts.slice(start, chunk).to_pylist()
        ids[start : start + len(part)] = [stable_row_id(t) for t in part]
    return ids


def index_triplets(
    anchors: Any,
    positives: Any,
    negatives: Any | None,
    pool: Any | None = None,
) -> tuple[pa.Table, Triplets]:
    """One ``(id, text)`` table of every distinct text, sorted by id, and the rows as positions
    in it: each text is tokenized and encoded once however often it occurs.

    Texts are Arrow string arrays (or lists); the work is done in Arrow, so a file of millions of
    rows never becomes millions of Python strings. ``negatives``: one given negative per row,
    ``""`` where a row has none. ``pool``: candidate texts for mining (``data.pool``); they join
    the table, and ``Triplets.pool`` holds their positions and the distinct positives'.
    """
    anchor_texts, positive_texts = _strings(anchors), _strings(positives)
    negative_texts = _strings(negatives) if negatives is not None else None
    pool_texts = _strings(pool) if pool is not None else None
    parts = [anchor_texts, positive_texts]
    if negative_texts is not None:
        parts.append(pc.filter(negative_texts, pc.greater(pc.utf8_length(negative_texts), 0)))
    if pool_texts is not None:
        parts.append(pool_texts)
    distinct = pc.unique(pa.concat_arrays(parts))
    ids = text_ids(distinct)
    order = np.argsort(ids, kind="stable")
    texts = distinct.take(pa.array(order))
    table = pa.table({"id": ids[order], "text": texts.cast(pa.string())})

    def positions(column: pa.Array) -> np.ndarray:
        found = pc.fill_null(pc.index_in(column, value_set=texts), -1)
        return found.to_numpy(zero_copy_only=False).astype(np.int64)

    positive = positions(positive_texts)
    triplets = Triplets(
        positions(anchor_texts),
        positive,
        positions(negative_texts)
        if negative_texts is not None
        else np.full(len(positive), -1, dtype=np.int64),
        pool=np.union1d(positions(pool_texts), positive) if pool_texts is not None else None,
    )
    return table, triplets
