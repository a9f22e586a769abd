"""Exact k-NN over vectors split into shards: every query is searched on every shard, and the
shards' top-k lists are merged into one.

A corpus of 10M+ rows does not fit one searcher (3 KB a row at 768 dimensions, before the
index's own copy). Each shard holds a contiguous slice of the rows and its own
:class:`~pipeline.mining.index.VectorIndex`; a query's ``k`` best over the whole corpus are
among the union of each shard's ``k`` best, so merging them gives exactly what one index over
all the rows gives (with flat indexes; IVF and IVF-PQ are approximate per shard as they are
whole). Queries go in chunks, so no process holds the ``n x k`` result of every query at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from pipeline.mining.index import IndexSpec, NeighbourSearch, VectorIndex, VectorSource


class IndexShard:
    """One shard: the rows ``first .. first + len(vectors) - 1`` of the searched vectors and
    their own :class:`~pipeline.mining.index.VectorIndex`.

    Args:
        vectors: ``(rows, d)`` float32, L2-normalised: this shard's slice; or a
            :class:`~pipeline.mining.index.VectorSource` of them (the index then holds the only
            copy where it can).
        first: the position of ``vectors[0]`` among all the shards' rows.
        spec, use_gpu, seed, k: as :class:`~pipeline.mining.index.VectorIndex`.
    """

    def __init__(
        self,
        vectors: np.ndarray | VectorSource,
        first: int,
        *,
        spec: IndexSpec | None = None,
        use_gpu: bool = False,
        seed: int = 0,
        k: int = 0,
    ):
        self.first = first
        self.index = VectorIndex(vectors, spec=spec, use_gpu=use_gpu, seed=seed, k=k)
        self.rows, self.backend, self.build_seconds = (
            self.index.rows,
            self.index.backend,
            self.index.build_seconds,
        )

    def vectors_of(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of this shard's ``rows`` (positions within its slice)."""
        return self.index.vectors_of(rows)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(m, min(k, rows))`` scores and positions among all the shards' rows (-1: none)."""
        scores, rows = self.index.search(queries, k)
        return scores, np.where(rows >= 0, rows + self.first, -1)


class ShardedIndex:
    """Shards of one index searched as one: each query on every shard, the top lists merged
    (:func:`merge_top_k`). A :class:`~pipeline.mining.index.NeighbourSearch`.

    Args:
        shards: anything with ``search``, ``rows``, ``backend`` and ``build_seconds`` (an
            :class:`IndexShard`, or a handle that answers for one), holding consecutive slices.
    """

    def __init__(self, shards: Sequence[NeighbourSearch]):
        self.shards = list(shards)
        self.rows = sum(shard.rows for shard in self.shards)
        self.backend = f"{self.shards[0].backend} x{len(self.shards)}"
        self.build_seconds = max(shard.build_seconds for shard in self.shards)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.rows)
        return merge_top_k([shard.search(queries, k) for shard in self.shards], k)


def merge_top_k(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each query over every shard's top list.

    Args:
        parts: per shard, ``(m, k_s)`` float32 scores (best first) and int64 corpus positions
            (-1: no row) of the same ``m`` queries.
        k: neighbours to keep per query.

    Returns:
        ``(m, k)`` scores, best first, and positions: a tie keeps the earlier shard's row
        first, and -1 (score ``-inf``) pads where the shards hold fewer than ``k`` rows in all.
    """
    scores = np.concatenate([s for s, _ in parts], axis=1)
    rows = np.concatenate([r for _, r in parts], axis=1)
    scores = np.where(rows >= 0, scores, -np.inf).astype(np.float32)
    if scores.shape[1] < k:
        pad = k - scores.shape[1]
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=-1)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, best, axis=1), np.take_along_axis(rows, best, axis=1)


def sharded_search(
    index: NeighbourSearch, queries: np.ndarray, k: int, query_chunk: int = 65_536
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Each chunk of ``queries`` searched on ``index`` (sharded or whole).

    Yields:
        ``(first query of the chunk, scores, positions)``, chunk after chunk, so a caller
        filters and keeps what it needs of a chunk before the next one is searched.
    """
    for lo in range(0, len(queries), query_chunk):
        yield (lo, *index.search(queries[lo : lo + query_chunk], k))
