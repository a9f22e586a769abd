"""Exact k-NN over vectors split into shards: every query is searched on every shard, and the
shards' top-k lists are merged into one.

A corpus of 10M+ rows does not fit one searcher (3 KB a row at 768 dimensions, before the
index's own copy). Each shard holds a contiguous slice of the rows and its own
:class:`~pipeline.mining.index.VectorIndex`; a query's ``k`` best over the whole corpus are
among the union of each shard's ``k`` best, so merging them gives exactly what one index over
all the rows gives (with flat indexes; IVF and IVF-PQ are approximate per shard as they are
whole). Queries go in chunks, so no process holds the ``n x k`` result of every query at once.

IVF shards share their cells: one index is trained on a sample drawn over every shard
(:func:`shared_sample`, :func:`~pipeline.mining.ivf_training.spherical_kmeans`,
:func:`~pipeline.mining.index.index_over_cells`), each shard lists its vectors under those
cells, and one ``nprobe`` is calibrated for them all (:func:`calibrate_shared_nprobe`).
Their merged search is then exactly one IVF index's over all the rows, and a query scans the
same lists in all as it would in one index, however many shards hold them; with cells of their
own, each shard would probe ``nprobe`` of its cells, and S shards scan about sqrt(S) times the
lists one index scans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pipeline.mining.index import (
    IndexSpec,
    NeighbourSearch,
    PretrainedIndex,
    VectorIndex,
    VectorSource,
    probe_until_recall,
    training_rows,
)


class IndexShard:
    """One shard: the rows ``first .. first + len(vectors) - 1`` of the searched vectors and
    their own :class:`~pipeline.mining.index.VectorIndex`.

    Args:
        vectors: ``(rows, d)`` float32, L2-normalised: this shard's slice; or a
            :class:`~pipeline.mining.index.VectorSource` of them (the index then holds the only
            copy where it can).
        first: the position of ``vectors[0]`` among all the shards' rows.
        spec, use_gpu, seed, k, pretrained: as :class:`~pipeline.mining.index.VectorIndex`
            (``pretrained``: the cells every shard shares).
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
        pretrained: PretrainedIndex | None = None,
    ):
        self.first = first
        self.index = VectorIndex(vectors, spec=spec, use_gpu=use_gpu, seed=seed, k=k, pretrained=pretrained)
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

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` from every row of the shard, whatever its index."""
        scores, rows = self.index.exact_search(queries, min(k, self.rows))
        return scores, rows + self.first

    def set_nprobe(self, nprobe: int) -> None:
        self.index.set_nprobe(nprobe)


class ProbedShards(NeighbourSearch, Protocol):
    """Shards of IVF lists under shared cells, searched as one: the miner's shard actors
    (:class:`~pipeline.mining.miner_shards.MinerShards`)."""

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top ``k`` from every row of every shard, merged."""
        ...

    def set_nprobe(self, nprobe: int) -> None:
        """Probe ``nprobe`` of the shared cells on every shard."""
        ...


def shared_sample(firsts: Sequence[int], rows: int, *, seed: int) -> list[np.ndarray]:
    """The sample an index over ``rows`` vectors in all trains its cells on
    (:func:`~pipeline.mining.index.training_rows`), split over the shards that start at
    ``firsts`` (ascending, the first 0): each shard's part as positions within the shard."""
    sample = training_rows(rows, "ivf", seed)
    bounds = [*firsts, rows]
    at = np.searchsorted(sample, bounds)
    return [sample[at[s] : at[s + 1]] - bounds[s] for s in range(len(firsts))]


def calibrate_shared_nprobe(shards: ProbedShards, queries: np.ndarray, *, cells: int) -> tuple[int, float]:
    """Set one ``nprobe`` on every shard (:func:`~pipeline.mining.index.probe_until_recall`):
    ``queries`` (a sample of the rows' vectors) against their exact top 10 over every shard.

    Returns:
        The ``nprobe`` set and the sample's recall@10 with it.
    """
    k = min(10, shards.rows)
    _, exact = shards.exact_search(queries, k)
    return probe_until_recall(
        lambda chunk: shards.search(chunk, k)[1], shards.set_nprobe, queries, exact, cells=cells
    )


def merge_top_k(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of each query over every shard's top list (``faiss.merge_knn_results``).

    Args:
        parts: per shard, ``(m, k_s)`` float32 scores (best first) and int64 positions (-1: no
            row) of the same ``m`` queries, ``k_s <= k``.
        k: neighbours to keep per query.

    Returns:
        ``(m, k)`` scores, best first, and positions; -1 (score ``-inf``) pads where the
        shards hold fewer than ``k`` rows in all.
    """
    import faiss  # deferred, as in pipeline.mining.index

    def widened(values: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(values, ((0, 0), (0, k - values.shape[1])), constant_values=fill)

    scores = np.stack([widened(np.where(r >= 0, s, -np.inf), -np.inf) for s, r in parts])
    rows = np.stack([widened(r, -1) for _, r in parts])
    scores, rows = faiss.merge_knn_results(scores.astype(np.float32), rows.astype(np.int64), keep_max=True)
    return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows  # faiss pads with -FLT_MAX
