"""The IVF index's cells: spherical k-means centroids of a sample of the vectors, trained where
the search runs. On the GPUs of a faiss-gpu build, faiss' own k-means runs there; on a CUDA
device whose faiss has no GPU support (the ``torch-cuda`` backend: faiss-gpu wheels need CUDA 12
while torch's are CUDA 13), the same k-means runs in torch, and faiss on the CPU then lists the
vectors under those centroids and searches them. Training at 1M rows took 68 s of a 440 s
refresh on 2 CPU cores (docs/benchmarks.md, "Mining refresh at scale").
"""

from __future__ import annotations

import numpy as np
import torch

KMEANS_ITERATIONS = 10
"""Rounds of assign-and-average: faiss' own default for an IVF quantizer."""

ASSIGN_CHUNK_ROWS = 65_536
"""Sample rows scored against every centroid at once (bounds the torch path's memory)."""


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


def spherical_kmeans(sample: np.ndarray, cells: int, *, seed: int, device: str) -> np.ndarray:
    """``(cells, d)`` spherical k-means centroids of ``sample`` in torch on ``device``: start
    from ``cells`` seeded sample rows, then :data:`KMEANS_ITERATIONS` rounds of assigning each
    row to its most similar centroid and normalising each cell's sum; an empty cell restarts
    from a random row (as faiss splits its largest)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32)).to(device)
    centroids = rows[torch.randperm(len(rows), generator=generator)[:cells].to(device)].clone()
    for _ in range(KMEANS_ITERATIONS):
        assigned = torch.cat([
            (rows[lo : lo + ASSIGN_CHUNK_ROWS] @ centroids.T).argmax(dim=1)
            for lo in range(0, len(rows), ASSIGN_CHUNK_ROWS)
        ])  # fmt: skip
        sums = torch.zeros_like(centroids).index_add_(0, assigned, rows)
        empty = torch.bincount(assigned, minlength=cells) == 0
        if bool(empty.any()):
            restart = torch.randint(len(rows), (int(empty.sum()),), generator=generator).to(device)
            sums[empty] = rows[restart]
        centroids = torch.nn.functional.normalize(sums, dim=1)
    return centroids.cpu().numpy()
