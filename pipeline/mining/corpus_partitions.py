"""The corpus cut into partitions of near texts, so that a refresh plans one partition at a time.

Planning a corpus needs every row's filtered neighbours at once (the ``knn`` sampler walks the
k-NN graph): about :data:`NEIGHBOUR_BYTES` a neighbour, 4 KB a row at the default ``top_k`` of
64, 40 GB at 10M rows. Cut into partitions of :func:`rows_per_partition` rows (each row in the
partition of its nearest centroid: spherical k-means over a sample of the vectors, as an IVF
index cuts its lists), a partition's neighbourhoods stay within it, and the miner holds one
partition's neighbours at a time, about :data:`PLAN_BYTES`. Each partition is planned into
whole batches, so its edges are moved to the nearest batch bound: at most half a batch of rows
of each partition is planned beside another partition's rows.

The rows of each partition stay where their vectors are: every holder (a miner shard) assigns
its own texts, only the cells' counts come to the miner, which cuts the partitions at batch
bounds and asks the holders for one partition's rows when it plans it (:class:`RankedRows`), so
no process holds every row's partition.

A corpus of at most that many rows is one partition: the plan is exactly the unpartitioned one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.ivf_training import SampleOnDevice, spherical_kmeans

PLAN_BYTES = 512 * 2**20
"""About the most memory a partition's neighbour lists take while it is planned."""

NEIGHBOUR_BYTES = 64
"""Bytes a (row, neighbour) pair takes while its partition is planned: its score, its
position, the filters' masks and the sampler's arrays. Measured: the traced peak of a
60,000-row refresh at ``top_k`` 64 was 65 B a pair with the ``knn`` sampler, 59 with
``random`` (docs/benchmarks.md, "Mining refresh over shards")."""


def rows_per_partition(k: int) -> int:
    """Most rows planned at once with ``k`` neighbours a row: :data:`PLAN_BYTES` of them."""
    return max(1, PLAN_BYTES // (NEIGHBOUR_BYTES * k))


TRAINING_ROWS_PER_CENTROID = 256
"""Sample rows per centroid the k-means trains on (faiss' own cap: more would only cost time)."""


@dataclass(frozen=True)
class CorpusPartition:
    """The rows one plan covers, and the batch sizes it cuts them into."""

    rows: np.ndarray
    """``(m,)`` sorted corpus positions."""
    sizes: np.ndarray
    """The global batches this partition fills: they sum to ``m``."""


@dataclass(frozen=True)
class CorpusPartitions:
    """The corpus' partitions as ranges of its partition order (rows by partition, then by
    position), each partition's rows fetched from their holders as it is reached.

    Args:
        row_bounds: ``(partitions + 1,)`` where each partition starts in that order, and the rows.
        batch_bounds: ``(partitions + 1,)`` the same in batches of ``sizes``.
        sizes: the epoch's batch sizes.
        rows_between: the sorted positions of the rows ranked ``lo`` to ``hi - 1``.
    """

    row_bounds: np.ndarray
    batch_bounds: np.ndarray
    sizes: np.ndarray
    rows_between: Callable[[int, int], np.ndarray]

    def __len__(self) -> int:
        return len(self.row_bounds) - 1

    def __iter__(self) -> Iterator[CorpusPartition]:
        for i in range(len(self)):
            rows = self.rows_between(int(self.row_bounds[i]), int(self.row_bounds[i + 1]))
            yield CorpusPartition(rows, self.sizes[self.batch_bounds[i] : self.batch_bounds[i + 1]])


def partition_corpus(
    texts: EncodedTexts, *, sizes: np.ndarray, partition_rows: int, seed: int
) -> CorpusPartitions:
    """The corpus in ``ceil(rows / partition_rows)`` partitions of near texts, with the epoch's
    batch sizes dealt out to them. The texts' holders assign and rank their own rows
    (:meth:`~pipeline.mining.encoded_texts.EncodedTexts.cell_counts`, ``order_by_cell``); only
    the cells' counts come here.

    Args:
        texts: the corpus under the newest weights.
        sizes: ``(num_batches,)`` the epoch's global batch sizes, summing to ``texts.rows``.
        partition_rows: most rows in a partition on average (k-means cells are uneven).
        seed: seeds the centroids' sample and training.

    Returns:
        The partitions, in the order of their centroids; one partition of every row (and every
        batch size) when the corpus is no larger than ``partition_rows``.
    """
    n = texts.rows
    sizes = np.asarray(sizes, dtype=np.int64)
    count = -(-n // partition_rows)
    if count <= 1:
        return CorpusPartitions(
            np.array([0, n]),
            np.array([0, len(sizes)]),
            sizes,
            lambda lo, hi: np.arange(lo, hi, dtype=np.int64),
        )
    counts = texts.cell_counts(centroids_of(texts, count=count, seed=seed))
    texts.order_by_cell(rank_offsets(counts))
    row_bounds, batch_bounds = cut_at_batch_bounds(counts.sum(axis=0), sizes)
    return CorpusPartitions(row_bounds, batch_bounds, sizes, texts.rows_ranked)


def centroids_of(texts: EncodedTexts, *, count: int, seed: int) -> np.ndarray:
    """``(count, dim)`` spherical k-means centroids, trained on a seeded sample of the vectors."""
    n = texts.rows
    size = min(n, count * TRAINING_ROWS_PER_CENTROID)
    sample = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
    # The same k-means and assignment as an IVF index's cells (on the CPU: the miner plans there).
    return spherical_kmeans(SampleOnDevice(texts.vectors(sample), "cpu"), count, seed=seed)


def rank_offsets(counts: np.ndarray) -> np.ndarray:
    """``(holders, cells)``: where each holder's rows of each cell start in the partition order,
    from each holder's count of them (``counts``, holders in position order)."""
    totals = counts.sum(axis=0)
    before_cell = np.concatenate([[0], np.cumsum(totals)[:-1]])
    return before_cell[None, :] + np.cumsum(counts, axis=0) - counts


class RankedRows:
    """One holder's texts in the corpus' partition order: sorted by cell, then by position.

    Args:
        assignment: ``(texts held,)`` each held text's cell.
        first: the corpus position of the first held text (a holder's texts are consecutive).
        offsets: ``(cells,)`` where this holder's texts of each cell start in the order
            (:func:`rank_offsets`).
    """

    def __init__(self, assignment: np.ndarray, first: int, offsets: np.ndarray):
        order = np.argsort(assignment, kind="stable")
        cells = assignment[order]
        # A text's rank is its cell's offset plus how many of the cell's held texts come before it.
        self.ranks = offsets[cells] + np.arange(len(cells)) - np.searchsorted(cells, cells)
        order += first
        self.positions = order

    def between(self, lo: int, hi: int) -> np.ndarray:
        """The sorted positions of the held texts ranked ``lo`` to ``hi - 1``."""
        start, stop = np.searchsorted(self.ranks, [lo, hi])
        return np.sort(self.positions[start:stop])


def cut_at_batch_bounds(counts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The partitions' bounds in the partition order, each cell's edge moved to the nearest
    bound of the batches ``sizes`` cut, so that every partition is whole batches.

    A partition whose edge moves forward takes the next cell's first rows, one whose edge moves
    back gives its last rows to the next. A partition left with no batch is dropped.

    Args:
        counts: ``(cells,)`` the rows of each cell.
        sizes: ``(num_batches,)`` batch sizes summing to the rows.

    Returns:
        ``(partitions + 1,)`` bounds in rows and in batches.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    edges = np.cumsum(counts)[:-1]
    ends = np.concatenate([[0], np.cumsum(sizes)])  # rows before each batch, and n
    # The nearest batch bound to each edge: the one at or after it, or the one before when nearer.
    after = np.searchsorted(ends, edges)
    before = np.maximum(after - 1, 0)
    nearest = np.where(edges - ends[before] < ends[after] - edges, before, after)
    batch_bounds = np.unique(np.concatenate([[0], nearest, [len(sizes)]]))
    return ends[batch_bounds], batch_bounds
