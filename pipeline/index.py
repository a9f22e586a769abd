"""Exact inner-product k-nearest-neighbour search behind one function, three backends.

* ``faiss-gpu``: a FAISS flat IP index on the GPUs, when faiss was built with GPU support.
* ``torch-cuda``: the same computation as chunked matrix products and ``topk`` on a CUDA
  device, for GPU machines whose faiss build has no GPU support (faiss-gpu wheels need
  CUDA 12 while current torch wheels are CUDA 13).
* ``faiss-cpu``: a FAISS flat IP index on the CPU.

Vectors must be L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class KnnResult:
    scores: np.ndarray
    """``(n, k)`` float32 similarities, best first."""
    indices: np.ndarray
    """``(n, k)`` int64 row positions; -1 where fewer than k exist."""
    backend: str
    index_seconds: float
    search_seconds: float


def choose_backend(use_gpu: bool) -> str:
    if use_gpu:
        import faiss

        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            return "faiss-gpu"
        import torch

        if torch.cuda.is_available():
            return "torch-cuda"
    return "faiss-cpu"


def knn_search(vectors: np.ndarray, k: int, use_gpu: bool = False, query_chunk: int = 8192) -> KnnResult:
    """Top-``k`` neighbours of every row of ``vectors`` among all rows (itself included).

    Args:
        vectors: ``(n, d)`` float32, L2-normalised.
        k: neighbours per row; capped at ``n``.
        use_gpu: search on a GPU when one is usable (see module docstring).
        query_chunk: queries per GPU matrix product (bounds GPU memory to ``chunk x n``).
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    k = min(k, n)
    backend = choose_backend(use_gpu)
    if backend == "torch-cuda":
        return _torch_search(vectors, k, query_chunk)
    import faiss

    start = time.perf_counter()
    index = faiss.IndexFlatIP(dim)
    if backend == "faiss-gpu":
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(vectors)
    built = time.perf_counter()
    scores, indices = index.search(vectors, k)
    done = time.perf_counter()
    return KnnResult(scores, indices.astype(np.int64), backend, built - start, done - built)


def _torch_search(vectors: np.ndarray, k: int, query_chunk: int) -> KnnResult:
    import torch

    start = time.perf_counter()
    base = torch.from_numpy(vectors).to("cuda")
    torch.cuda.synchronize()
    built = time.perf_counter()
    scores = np.empty((len(vectors), k), dtype=np.float32)
    indices = np.empty((len(vectors), k), dtype=np.int64)
    for lo in range(0, len(vectors), query_chunk):
        sims = base[lo : lo + query_chunk] @ base.T
        top = torch.topk(sims, k, dim=1)
        scores[lo : lo + query_chunk] = top.values.cpu().numpy()
        indices[lo : lo + query_chunk] = top.indices.cpu().numpy()
    done = time.perf_counter()
    return KnnResult(scores, indices, "torch-cuda", built - start, done - built)
