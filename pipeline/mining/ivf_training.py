"""The IVF index's cells: spherical k-means centroids of a sample of the vectors, trained where
the search runs. On the GPUs of a faiss-gpu build, faiss' own k-means runs there; on a CUDA
device whose faiss has no GPU support (the ``torch-cuda`` backend: faiss-gpu wheels need CUDA 12
while torch's are CUDA 13), the same k-means runs in torch, and faiss on the CPU then lists the
vectors under those centroids and searches them. A miner's shards train their shared cells with
the same torch k-means, each assigning its own part of the sample on its own device
(:func:`spherical_kmeans_over`). Training at 1M rows took 68 s of a 440 s refresh on 2 CPU
cores (docs/benchmarks.md, "Mining refresh at scale").
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

KMEANS_ITERATIONS = 10
"""Rounds of assign-and-average: faiss' own default for an IVF quantizer."""

ASSIGN_SCORES_BYTES = 64 * 2**20
"""The scores of one chunk of sample rows against every centroid: 1,352 rows at the 12,404
cells of 10M rows (at a fixed 65,536 rows they were 3.25 GB, more than a shard's whole share)."""


def ivf_centroids(sample: np.ndarray, cells: int, *, backend: str, seed: int) -> np.ndarray:
    """``(cells, d)`` float32 unit centroids of ``sample`` (``(m, d)`` float32, L2-normalised,
    ``m >= cells``) for an inner-product IVF index searched by ``backend``: faiss' k-means on
    the CPU or, for ``faiss-gpu``, on the GPUs; torch's on the CUDA device for ``torch-cuda``."""
    if backend == "torch-cuda":
        return spherical_kmeans(sample, cells, seed=seed, device="cuda")
    import faiss  # deferred, as in pipeline.mining.index

    kmeans = faiss.Kmeans(
        sample.shape[1], cells, niter=KMEANS_ITERATIONS, seed=seed, spherical=True,
        gpu=backend == "faiss-gpu", max_points_per_centroid=len(sample), verbose=False,
    )  # fmt: skip
    kmeans.train(np.ascontiguousarray(sample, dtype=np.float32))
    return np.ascontiguousarray(kmeans.centroids, dtype=np.float32)


class SampleParts(Protocol):
    """A k-means sample held in parts: one array in this process (:class:`SampleInMemory`), or
    a part in each of a miner's shards, which assign their own rows in parallel
    (:class:`~pipeline.mining.miner_shards.MinerShards`)."""

    size: int
    """Rows in all the parts."""

    def rows(self, picks: np.ndarray) -> np.ndarray:
        """``(len(picks), d)`` float32 rows of the sample at ``picks`` (numbers among all the
        parts' rows, in part order), in the order given."""
        ...

    def cell_sums(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every part's :func:`nearest_cell_sums` against ``centroids``, added up."""
        ...


class SampleInMemory:
    """A sample in one array, assigned on ``device``."""

    def __init__(self, sample: np.ndarray, device: str):
        self.vectors = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32)).to(device)
        self.size = len(sample)

    def rows(self, picks: np.ndarray) -> np.ndarray:
        return self.vectors[torch.from_numpy(np.asarray(picks)).to(self.vectors.device)].cpu().numpy()

    def cell_sums(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return nearest_cell_sums(self.vectors, centroids)


def spherical_kmeans(sample: np.ndarray, cells: int, *, seed: int, device: str) -> np.ndarray:
    """:func:`spherical_kmeans_over` one array (``(m, d)`` float32, L2-normalised) in torch on
    ``device``."""
    return spherical_kmeans_over(SampleInMemory(sample, device), cells, seed=seed)


def spherical_kmeans_over(sample: SampleParts, cells: int, *, seed: int) -> np.ndarray:
    """``(cells, d)`` float32 unit centroids of ``sample`` (``size >= cells`` L2-normalised
    rows): start from ``cells`` seeded rows, then :data:`KMEANS_ITERATIONS` rounds of assigning
    each row to its most similar centroid and normalising each cell's sum; an empty cell
    restarts from a random row (as faiss splits its largest). Only the centroids and the sums
    travel between the parts and here, so the parts may sit in other processes."""
    rng = np.random.default_rng(seed)
    centroids = sample.rows(rng.choice(sample.size, size=cells, replace=False))
    for _ in range(KMEANS_ITERATIONS):
        sums, counts = sample.cell_sums(centroids)
        empty = np.flatnonzero(counts == 0)
        if len(empty):
            sums[empty] = sample.rows(rng.integers(sample.size, size=len(empty)))
        centroids = (sums / np.linalg.norm(sums, axis=1, keepdims=True)).astype(np.float32)
    return centroids


def nearest_cell_sums(rows: torch.Tensor, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum (``(cells, d)`` float64) and count (``(cells,)`` int64) of the ``rows`` (a
    ``(m, d)`` float32 tensor) whose most similar centroid is each of ``centroids``, computed
    a chunk of rows at a time (:data:`ASSIGN_SCORES_BYTES` of scores) on the rows' device.
    Float64, so that parts summed in any order give the same centroids to float32's precision."""
    cells = len(centroids)
    on_device = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32)).to(rows.device)
    sums = torch.zeros((cells, rows.shape[1]), dtype=torch.float64, device=rows.device)
    counts = torch.zeros(cells, dtype=torch.int64, device=rows.device)
    chunk_rows = max(1, ASSIGN_SCORES_BYTES // (4 * cells))
    for lo in range(0, len(rows), chunk_rows):
        chunk = rows[lo : lo + chunk_rows]
        nearest = (chunk @ on_device.T).argmax(dim=1)
        sums.index_add_(0, nearest, chunk.double())
        counts += torch.bincount(nearest, minlength=cells)
    return sums.cpu().numpy(), counts.cpu().numpy()
