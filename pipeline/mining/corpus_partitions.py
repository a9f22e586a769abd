"""The corpus cut into partitions of near texts, so that a refresh plans one partition at a time.

Planning a corpus needs every row's filtered neighbours at once (the ``knn`` sampler walks the
k-NN graph): about :data:`NEIGHBOUR_BYTES` a neighbour, 4 KB a row at the default ``top_k`` of
64, 40 GB at 10M rows. Cut into partitions of :func:`rows_per_partition` rows (each row in the
partition of its nearest centroid: spherical k-means over a sample of the vectors, as an IVF
index cuts its lists), a partition's neighbourhoods stay within it, and the miner holds one
partition's neighbours at a time, about :data:`PLAN_BYTES`. Each partition is planned into
whole batches, so its edges are moved to the nearest batch bound: at most half a batch of rows
of each partition is planned beside another partition's rows.

A corpus of at most that many rows is one partition: the plan is exactly the unpartitioned one.
"""

from __future__ import annotations

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


def partition_corpus(
    texts: EncodedTexts, *, sizes: np.ndarray, partition_rows: int, seed: int
) -> list[CorpusPartition]:
    """The corpus in ``ceil(rows / partition_rows)`` partitions of near texts, with the epoch's
    batch sizes dealt out to them.

    Args:
        texts: the corpus under the newest weights.
        sizes: ``(num_batches,)`` the epoch's global batch sizes, summing to ``texts.rows``.
        partition_rows: most rows in a partition on average (k-means cells are uneven).
        seed: seeds the centroids' sample and training.

    Returns:
        The partitions with rows, in the order of their centroids; one partition of every row
        (and every batch size) when the corpus is no larger than ``partition_rows``.
    """
    n = texts.rows
    count = -(-n // partition_rows)
    if count <= 1:
        return [CorpusPartition(np.arange(n, dtype=np.int64), np.asarray(sizes, dtype=np.int64))]
    return cut_at_batch_bounds(nearest_centroids(texts, count=count, seed=seed), sizes)


def nearest_centroids(texts: EncodedTexts, *, count: int, seed: int) -> np.ndarray:
    """``(rows,)``: each row's nearest of ``count`` spherical k-means centroids, trained on a
    seeded sample of the vectors; every row is assigned where its vector is (the shards)."""
    n = texts.rows
    size = min(n, count * TRAINING_ROWS_PER_CENTROID)
    sample = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
    # The same k-means and assignment as an IVF index's cells (on the CPU: the miner plans there).
    centroids = spherical_kmeans(SampleOnDevice(texts.vectors(sample), "cpu"), count, seed=seed)
    return texts.nearest(centroids)


def cut_at_batch_bounds(assignment: np.ndarray, sizes: np.ndarray) -> list[CorpusPartition]:
    """Partitions of the rows by ``assignment``, each edge moved to the nearest bound of the
    batches ``sizes`` cut, so that every partition is whole batches.

    Rows are taken partition after partition, each partition's in position order; a partition
    whose edge moves forward takes the next partition's first rows, one whose edge moves back
    gives its last rows to the next. A partition left with no batch is dropped.

    Args:
        assignment: ``(n,)`` each row's partition.
        sizes: ``(num_batches,)`` batch sizes summing to ``n``.

    Returns:
        The non-empty partitions, with their rows and their batches' sizes.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(assignment, kind="stable")
    edges = np.cumsum(np.bincount(assignment))[:-1]
    ends = np.concatenate([[0], np.cumsum(sizes)])  # rows before each batch, and n
    # The nearest batch bound to each edge: the one at or after it, or the one before when nearer.
    after = np.searchsorted(ends, edges)
    before = np.maximum(after - 1, 0)
    nearest = np.where(edges - ends[before] < ends[after] - edges, before, after)
    batch_bounds = np.unique(np.concatenate([[0], nearest, [len(sizes)]]))
    row_bounds = ends[batch_bounds]
    return [
        CorpusPartition(np.sort(order[row_bounds[i] : row_bounds[i + 1]]), sizes[batch_bounds[i] : batch_bounds[i + 1]])
        for i in range(len(batch_bounds) - 1)
    ]  # fmt: skip
