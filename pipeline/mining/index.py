"""Inner-product k-nearest-neighbour search behind one function.

Index kinds: ``flat`` (exact), ``ivf`` (inverted lists over k-means cells, exact
distances inside the ``nprobe`` cells searched) and ``ivfpq`` (the same with product-
quantised vectors: ~``pq_m`` bytes a vector, approximate distances). ``auto`` is flat up to
``flat_max_rows`` (50k by default: all-rows flat search grows as n^2) and IVF above.

Backends, chosen by :func:`choose_backend`:

* ``faiss-gpu``: FAISS on the GPUs, when faiss was built with GPU support.
* ``torch-cuda``: exact search as chunked matrix products and ``topk`` on a CUDA device,
  for GPU machines whose faiss build has no GPU support (faiss-gpu wheels need CUDA 12
  while current torch wheels are CUDA 13). Flat only; IVF kinds fall back to faiss-cpu.
* ``faiss-cpu``: FAISS on the CPU.

Vectors must be L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config.mining_section import MiningSection

INDEX_KINDS = ("auto", "flat", "ivf", "ivfpq")
# k-means training points per IVF cell. FAISS wants 39 to 256; 64 kept recall@10 at 0.992
# (vs 0.993 with 256) on 100k clustered vectors, and trains on 4x fewer points at 1M rows.
TRAIN_POINTS_PER_CELL = 64


@dataclass
class IndexSpec:
    kind: str = "auto"
    flat_max_rows: int = 50_000
    nlist: int | None = None
    """IVF cells; ``None``: 4 x sqrt(n), the usual FAISS rule of thumb."""
    nprobe: int = 32
    pq_m: int = 16
    """Bytes per vector for ``ivfpq`` (must divide the dimension)."""

    @classmethod
    def from_section(cls, mining: MiningSection) -> IndexSpec:
        """The ``mining`` section's index settings."""
        return cls(mining.index, mining.flat_max_rows, mining.nlist, mining.nprobe, mining.pq_m)

    def resolve(self, n: int) -> str:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"mining.index must be one of {', '.join(INDEX_KINDS)} (got {self.kind!r})")
        if self.kind == "auto":
            return "flat" if n <= self.flat_max_rows else "ivf"
        return self.kind

    def cells(self, n: int) -> int:
        # At least 39 training points per cell (FAISS warns below that), at most 65536 cells.
        wanted = self.nlist or int(4 * math.sqrt(n))
        return max(1, min(wanted, n // 39, 65536))


def estimate_index_bytes(n: int, dim: int, k: int, kind: str, spec: IndexSpec | None = None) -> int:
    """Memory an index over n vectors and its all-rows k-NN result need, in bytes.

    The embeddings themselves (n x dim float32) are counted once, as the caller holds them.
    """
    spec = spec or IndexSpec()
    embeddings = n * dim * 4
    result = n * k * (4 + 8)
    if kind == "flat":
        index = n * dim * 4
    elif kind == "ivf":
        index = n * dim * 4 + n * 8 + spec.cells(n) * dim * 4
    else:
        index = n * (spec.pq_m + 8) + spec.cells(n) * dim * 4 + 256 * dim * 4
    return embeddings + index + result


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
        import faiss  # deferred: an optional extra ([cpu] or [gpu]); preflight names what is missing

        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            return "faiss-gpu"

        if torch.cuda.is_available():
            return "torch-cuda"
    return "faiss-cpu"


def knn_search(
    vectors: np.ndarray,
    k: int,
    use_gpu: bool = False,
    spec: IndexSpec | None = None,
    query_chunk: int = 8192,
    seed: int = 0,
    queries: np.ndarray | None = None,
) -> KnnResult:
    """Top-``k`` neighbours among the rows of ``vectors`` for each query.

    Args:
        vectors: ``(n, d)`` float32, L2-normalised: the searched corpus.
        k: neighbours per query; capped at ``n``.
        use_gpu: search on a GPU when one is usable (see module docstring).
        spec: index kind and IVF parameters (default: flat up to 50k rows, else IVF).
        query_chunk: queries per GPU matrix product (bounds GPU memory to ``chunk x n``).
        seed: for the IVF training sample.
        queries: ``(m, d)`` float32, L2-normalised; ``None`` searches every row of
            ``vectors`` (each finds itself first).
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    queries = vectors if queries is None else np.ascontiguousarray(queries, dtype=np.float32)
    n, dim = vectors.shape
    k = min(k, n)
    spec = spec or IndexSpec()
    kind = spec.resolve(n)
    backend = choose_backend(use_gpu)
    if backend == "torch-cuda" and kind == "flat":
        return torch_search(vectors, queries, k, query_chunk)
    if backend == "torch-cuda":
        backend = "faiss-cpu"
    import faiss  # deferred, as in choose_backend

    start = time.perf_counter()
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        cells = spec.cells(n)
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, dim, cells, faiss.METRIC_INNER_PRODUCT)
        else:
            if dim % spec.pq_m:
                raise ValueError(f"mining.pq_m ({spec.pq_m}) must divide the embedding size ({dim})")
            index = faiss.IndexIVFPQ(quantizer, dim, cells, spec.pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(seed).choice(
            n, size=min(n, cells * TRAIN_POINTS_PER_CELL), replace=False
        )
        index.train(vectors[np.sort(sample)])
        index.nprobe = min(spec.nprobe, cells)
    if backend == "faiss-gpu":
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(vectors)
    built = time.perf_counter()
    scores, indices = index.search(queries, k)
    done = time.perf_counter()
    return KnnResult(scores, indices.astype(np.int64), f"{backend}/{kind}", built - start, done - built)


def torch_search(
    vectors: np.ndarray, queries: np.ndarray, k: int, query_chunk: int, device: str = "cuda"
) -> KnnResult:
    """Exact top-``k`` by inner product, as chunked matrix products and ``topk`` in torch on
    ``device``: the ``torch-cuda`` backend, and on ``"cpu"`` the same search for a machine
    with neither faiss nor CUDA (``bench.gpu_step`` times it there).

    Args:
        vectors: ``(n, d)`` float32, L2-normalised, C-contiguous: the searched corpus.
        queries: ``(m, d)`` float32, L2-normalised, C-contiguous.
        k: neighbours per query, at most ``n``.
        query_chunk: queries per matrix product (bounds memory to ``chunk x n`` scores).
        device: ``"cuda"`` or ``"cpu"``; the backend is named ``torch-<device>/flat``.
    """
    start = time.perf_counter()
    base = torch.from_numpy(vectors).to(device)
    if base.is_cuda:
        torch.cuda.synchronize()
    built = time.perf_counter()
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    for lo in range(0, len(queries), query_chunk):
        sims = torch.from_numpy(queries[lo : lo + query_chunk]).to(device) @ base.T
        top = torch.topk(sims, k, dim=1)
        scores[lo : lo + query_chunk] = top.values.cpu().numpy()
        indices[lo : lo + query_chunk] = top.indices.cpu().numpy()
    done = time.perf_counter()
    return KnnResult(scores, indices, f"torch-{device}/flat", built - start, done - built)
