"""The one k-means: IVF's cells and the corpus' partitions are spherical k-means centroids of a
sample of the vectors, trained by faiss' ``faiss.contrib.clustering.kmeans`` over a sample that
may be held in parts, as faiss' ``benchs/distributed_ondisk`` trains over machines: each part
assigns its own rows to the centroids where it lives (:class:`SampleOnDevice`; a miner's shards:
:class:`~pipeline.mining.miner_shards.SampleOverShards`), and only the centroids, the
assignments and the cells' sums travel. The assignment runs in torch on the part's device, so
a CUDA device trains its cells there whatever faiss build sits beside it (faiss-gpu wheels need
CUDA 12, torch's are CUDA 13).
"""

from __future__ import annotations

import contextlib
import io
from typing import Protocol

import numpy as np
import torch

KMEANS_ITERATIONS = 10
"""Rounds of assign-and-average: faiss' own default for an IVF quantizer."""

ASSIGN_SCORES_BYTES = 64 * 2**20
"""The scores of one chunk of rows against every centroid: 1,352 rows at the 12,404 cells of
10M rows, where a fixed 65,536 rows would hold 3.25 GB, more than a shard's whole share."""


class AssignableSample(Protocol):
    """faiss' ``DatasetAssign`` interface (``faiss.contrib.clustering``): a k-means sample that
    assigns its own rows, in one array (:class:`SampleOnDevice`) or in parts."""

    def count(self) -> int:
        """Rows in the sample."""
        ...

    def dim(self) -> int:
        """Their dimension."""
        ...

    def get_subset(self, indices: np.ndarray) -> np.ndarray:
        """``(len(indices), d)`` float32 rows at ``indices``, in the order given."""
        ...

    def assign_to(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's most similar of the ``centroids`` (by cosine), its similarity, and the
        ``(cells, d)`` float64 sum of each cell's rows."""
        ...


def nearest_cells(rows: torch.Tensor, centroids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m,)`` int64 index of each of ``rows`` (``(m, d)``) most similar unit centroid
    (``centroids`` normalised here) and ``(m,)`` its similarity, on the rows' device, a chunk
    of rows at a time (:data:`ASSIGN_SCORES_BYTES` of scores)."""
    # A copy: centroids from the object store are read-only, which torch warns of.
    units = torch.from_numpy(np.array(centroids, dtype=np.float32)).to(rows.device)
    units = torch.nn.functional.normalize(units, dim=1)
    chunk_rows = max(1, ASSIGN_SCORES_BYTES // (4 * len(units)))
    best = [(chunk @ units.T).max(dim=1) for chunk in rows.split(chunk_rows)]
    return torch.cat([b.indices for b in best]), torch.cat([b.values for b in best])


class SampleOnDevice:
    """A sample in one array, assigned in torch on ``device`` (an :class:`AssignableSample`).
    Its cells' sums are float64, so that parts summed in any order give the same centroids to
    float32's precision."""

    def __init__(self, sample: np.ndarray, device: str | torch.device):
        self.vectors = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32)).to(device)

    def count(self) -> int:
        return len(self.vectors)

    def dim(self) -> int:
        return self.vectors.shape[1]

    def get_subset(self, indices: np.ndarray) -> np.ndarray:
        return self.vectors[torch.from_numpy(np.asarray(indices)).to(self.vectors.device)].cpu().numpy()

    def assign_to(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nearest, similarity = nearest_cells(self.vectors, centroids)
        sums = torch.zeros((len(centroids), self.dim()), dtype=torch.float64, device=self.vectors.device)
        sums.index_add_(0, nearest, self.vectors.double())
        return nearest.cpu().numpy(), similarity.cpu().numpy(), sums.cpu().numpy()


def spherical_kmeans(sample: AssignableSample, cells: int, *, seed: int) -> np.ndarray:
    """``(cells, d)`` float32 unit centroids of ``sample`` (at least ``cells`` L2-normalised
    rows): ``faiss.contrib.clustering.kmeans`` for :data:`KMEANS_ITERATIONS` rounds from
    ``cells`` seeded rows, empty cells split off the large ones as faiss does. It averages the
    cells; assigning rows by cosine to the averages (:func:`nearest_cells`) and normalising the
    last makes it spherical: the normalised mean of a cell is the normalised sum."""
    from faiss.contrib.clustering import kmeans  # deferred, as in pipeline.mining.index

    # Its progress lines go to stdout even when not verbose: the refresh prints its own.
    with contextlib.redirect_stdout(io.StringIO()):
        centroids = kmeans(cells, sample, niter=KMEANS_ITERATIONS, seed=seed, verbose=False)
    return (centroids / np.linalg.norm(centroids, axis=1, keepdims=True)).astype(np.float32)
