"""Inner-product k-nearest-neighbour search behind one function.

Index kinds: ``flat`` (exact), ``ivf`` (inverted lists over k-means cells, exact distances
inside the ``nprobe`` cells searched, calibrated up from :data:`NPROBE`) and ``ivfpq`` (the same
with product-quantised vectors: ~:data:`PQ_BYTES` bytes a vector, approximate distances). ``auto`` is flat
up to :data:`FLAT_MAX_ROWS_CPU` vectors (:data:`FLAT_MAX_ROWS_GPU` where the search runs on a
GPU) and IVF above: all-rows flat search grows as n^2, IVF's about as n^1.5. These settings
are not config keys: the corpus size and the search device decide them, from the measurements
in docs/benchmarks.md (Mining refresh at scale; Per-worker compute).

Backends, chosen by :func:`choose_backend`:

* ``faiss-gpu``: FAISS on the GPUs, when faiss was built with GPU support: the index split
  over the GPUs the process was given.
* ``torch-cuda``: exact search as chunked matrix products and ``topk`` on a CUDA device,
  for GPU machines whose faiss build has no GPU support (faiss-gpu wheels need CUDA 12
  while current torch wheels are CUDA 13). Flat only; IVF kinds list and search the vectors
  with faiss on the CPU.
* ``faiss-cpu``: FAISS on the CPU.

On every backend IVF's cells come from the one k-means (:mod:`~pipeline.mining.ivf_training`),
whose assignments run in torch where the vectors are, a GPU included.

Vectors must be L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.core.errors import ConfigError
from pipeline.core.heap import release_free_heap

INDEX_KINDS = ("auto", "flat", "ivf", "ivfpq")
# Largest corpus ``auto`` searches exactly on a CPU. 384-d vectors, 2 threads: flat 12.5 s
# against IVF 7.6 s at 50k rows, 52.4 s against 21.4 s at 100k, IVF recall@10 1.000 on both
# (docs/benchmarks.md, Mining refresh at scale: a real model on CPU).
FLAT_MAX_ROWS_CPU = 50_000
# The same where the search runs on a GPU (faiss-gpu, or torch-cuda's exact top-k): one H100
# searched 1M x 768 vectors at about 23,000 queries/s, i.e. ~44 s for all 1M rows (docs/
# benchmarks.md, Per-worker compute: base BERT on one H100); n^2 puts 2M at ~3 min, and its
# 6 GiB of vectors fit one GPU. Above that IVF, whose torch-cuda fallback is faiss on the CPU.
FLAT_MAX_ROWS_GPU = 2_000_000
# IVF cells searched per query: recall@10 of 0.98 or more against flat search on clustered
# data at 50k-100k rows (docs/benchmarks.md, Mining refresh at scale).
NPROBE = 32
# Bytes per vector for ``ivfpq`` (the largest of its divisors that divides the dimension).
PQ_BYTES = 16
# IVF's nprobe is raised from NPROBE (doubled, then the last step bisected) until a sample of
# the indexed rows finds this share of its exact top 10 (probe_until_recall).
RECALL_TARGET = 0.95
CALIBRATION_QUERIES = 256
RECALL_CONFIDENCE_Z = 1.645
"""The sample's recall must reach :data:`RECALL_TARGET` less this many standard errors of its
mean (a one-sided 95% bound): the rows the index serves are not the sample's, and at 1M rows a
sample mean that just reached 0.95 found 0.950-0.953 on 1,000 other rows, half a standard
error from falling short."""
# k-means training points per IVF cell. FAISS wants 39 to 256; 64 kept recall@10 at 0.992
# (vs 0.993 with 256) on 100k clustered vectors, and trains on 4x fewer points at 1M rows.
TRAIN_POINTS_PER_CELL = 64
IVF_PROBE_BYTES = 64 * 2**20
"""What an IVF search's probed cells may take at once: queries are searched in blocks of
this over ``nprobe x 12`` bytes."""
EXACT_BLOCK_BYTES = 64 * 2**20
"""The vectors of one block of :func:`exact_top_k` (held twice: fetched, and in its flat index)."""
PQ_TRAIN_ROWS = 65_536
"""Sample rows IVF-PQ's codebooks train on where the cells were trained apart
(:func:`index_over_cells`): faiss' own cap, 256 rows for each of a code's 256 values."""

ADD_CHUNK_ROWS = 131_072
"""Vectors added to a faiss index at once (32 MiB at 64 dimensions, 384 MiB at 768): what a
:class:`VectorSource`'s index holds beside its own copy while it is built."""


@dataclass
class IndexSpec:
    kind: str = "auto"
    """``mining.index``: ``auto``, ``flat``, ``ivf`` or ``ivfpq``."""

    def resolve(self, n: int, backend: str = "faiss-cpu", *, dim: int = 0, budget: int | None = None) -> str:
        """The index kind to build over ``n`` vectors searched by ``backend``
        (:func:`choose_backend`): ``auto`` is flat up to the device's limit, IVF above, and
        IVF-PQ where the flat or IVF vectors would not fit ``budget``.

        Args:
            n: vectors indexed.
            backend: where the search runs.
            dim: their dimension, for the memory check.
            budget: bytes the index may take beside the vectors already held
                (:func:`index_memory_budget`); None: no check.

        Raises:
            ConfigError: an unknown kind, or no kind that fits ``budget`` (before anything is
                built: one line naming the size and what to change).
        """
        if self.kind not in INDEX_KINDS:
            raise ConfigError(f"mining.index must be one of {', '.join(INDEX_KINDS)} (got {self.kind!r})")
        kind = self.kind
        if kind == "auto":
            flat_max_rows = FLAT_MAX_ROWS_CPU if backend == "faiss-cpu" else FLAT_MAX_ROWS_GPU
            kind = "flat" if n <= flat_max_rows else "ivf"
            if budget is not None and index_bytes(n, dim, kind) > budget:
                kind = "ivfpq"
        needed = index_bytes(n, dim, kind)
        if budget is not None and needed > budget:
            raise ConfigError(
                f"mining.index: a {kind} index over {n} x {dim} vectors needs about "
                f"{needed / 2**30:.1f} GiB, more than the {budget / 2**30:.1f} GiB free where it is "
                "built; add mining shards (more memory in all) or set mining.index: ivfpq"
            )
        return kind


def index_memory_budget(backend: str, share: float = 0.8) -> int | None:
    """Bytes an index built now for ``backend`` may take: ``share`` of the GPU's free memory
    for the GPU backends (torch's view of the current device), of the machine's available
    memory for ``faiss-cpu``. The rest is left for the search's own buffers and whatever
    else the process holds. None where the GPU's free memory cannot be read (faiss-gpu beside
    a torch built without CUDA)."""
    if backend.startswith(("faiss-gpu", "torch-cuda")):
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info()
    else:
        import psutil  # deferred: Ray's dependency, present wherever the miner runs

        free = psutil.virtual_memory().available
    return int(free * share)


def query_chunk_for(free_bytes: int, rows: int, k: int, most: int = 65_536) -> int:
    """Queries per matrix product on the ``torch-cuda`` path so that a chunk's scores
    (``chunk x rows`` float32) and its top-k (``chunk x k``, 12 B each) take at most half of
    ``free_bytes``: at 2M rows a fixed 8,192 queries would be 61 GiB of scores."""
    per_query = rows * 4 + k * 12
    return int(max(1, min(most, free_bytes // 2 // max(per_query, 1))))


def ivf_cells(n: int) -> int:
    """IVF cells over ``n`` vectors: 4 x sqrt(n), the usual FAISS rule of thumb, with at least
    39 training points per cell (FAISS warns below that) and at most 65536 cells."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39, 65536))


def pq_bytes(dim: int) -> int:
    """Bytes per vector for ``ivfpq``: the largest divisor of :data:`PQ_BYTES` that divides
    ``dim`` (FAISS splits the vector into that many equal sub-vectors)."""
    return max(m for m in range(1, PQ_BYTES + 1) if PQ_BYTES % m == 0 and dim % m == 0)


def index_bytes(n: int, dim: int, kind: str) -> int:
    """Memory an index of ``kind`` (resolved, not ``auto``) over ``n`` vectors holds, in bytes:
    its own copy of the vectors (or their codes), ids and cell centroids."""
    if kind == "flat":
        return n * dim * 4
    if kind == "ivf":
        return n * dim * 4 + n * 8 + ivf_cells(n) * dim * 4
    return n * (pq_bytes(dim) + 8) + ivf_cells(n) * dim * 4 + 256 * dim * 4


def estimate_index_bytes(n: int, dim: int, k: int, kind: str, queries: int | None = None) -> int:
    """Memory a search over ``n`` vectors needs, in bytes: the embeddings (n x dim float32,
    counted once, as the caller holds them), the index (:func:`index_bytes`) and the k-NN
    result. ``queries``: rows of the result held at once (default ``n``: every row searched
    in one go; a sharded search holds one chunk's)."""
    result = (n if queries is None else queries) * k * (4 + 8)
    return n * dim * 4 + index_bytes(n, dim, kind) + result


def index_summary(kind: str, n: int, dim: int, k: int, estimate: int) -> str:
    """The line a mining prints before it builds the index: its kind, size and memory."""
    return f"{kind} index over {n} x {dim} vectors, k={k}: about {estimate / 2**20:.1f} MiB"


def choose_backend(use_gpu: bool) -> str:
    if use_gpu:
        import faiss  # deferred: an optional extra ([cpu] or [gpu]); preflight names what is missing

        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            return "faiss-gpu"

        if torch.cuda.is_available():
            return "torch-cuda"
    return "faiss-cpu"


@dataclass
class VectorSource:
    """Vectors computed on demand (an encoder's): :class:`VectorIndex` adds them a chunk at a
    time, so a process that builds an index never holds them twice.

    Args:
        rows: how many.
        dim: their dimension.
        fetch: ``(len(positions), dim)`` float32, L2-normalised, of any sorted positions.
    """

    rows: int
    dim: int
    fetch: Callable[[np.ndarray], np.ndarray]
    seconds: float = 0.0
    """Spent in ``fetch`` so far."""

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        out = self.fetch(positions)
        self.seconds += time.perf_counter() - started
        return out


@dataclass
class PretrainedIndex:
    """An empty index whose IVF cells (and IVF-PQ codebooks) were trained elsewhere, on a
    sample drawn over every shard (:func:`index_over_cells`), and this index's rows of that sample,
    already encoded: the index adds its vectors to it, fetching none of the sample's again.
    Shards that list their vectors under the same cells search, merged, as one index does."""

    index: np.ndarray
    """The trained empty index, as ``faiss.serialize_index`` writes it."""
    sample_rows: np.ndarray
    """Sorted positions, among this index's vectors, of its part of the sample."""
    sample_vectors: np.ndarray
    """``(len(sample_rows), d)`` float32: their vectors."""


class VectorIndex:
    """An index over L2-normalised vectors, built once and searched as often as asked: a miner
    shard builds one over its slice and searches it chunk after chunk of queries.

    Args:
        vectors: ``(n, d)`` float32, L2-normalised: the searched rows; or a
            :class:`VectorSource`, whose vectors a ``faiss-cpu`` flat or IVF index then holds
            as the only copy (:meth:`vectors_of` reads them back), fetched
            :data:`ADD_CHUNK_ROWS` at a time after the IVF training sample (fetched once: its
            vectors are added from the sample).
        use_gpu: search on a GPU when one is usable (see module docstring).
        spec: the index kind (default ``auto``).
        query_chunk: queries per matrix product on the ``torch-cuda`` path (bounds its
            memory to ``chunk x n`` scores); None: sized from the GPU's free memory
            (:func:`query_chunk_for`).
        k: the neighbours searched, which size the ``torch-cuda`` path's query chunks.
        pretrained: for ``ivf`` and ``ivfpq``, the empty index whose cells were trained over
            every shard (:meth:`~pipeline.mining.miner_shards.MinerShards.encode`), for this
            index to fill; its ``nprobe`` is the caller's to set (:func:`calibrate_nprobe`).
    """

    def __init__(
        self,
        vectors: np.ndarray | VectorSource,
        *,
        use_gpu: bool = False,
        spec: IndexSpec | None = None,
        query_chunk: int | None = None,
        k: int = 0,
        pretrained: PretrainedIndex | None = None,
    ):
        start = time.perf_counter()
        source = vectors if isinstance(vectors, VectorSource) else None
        self.rows, dim = (source.rows, source.dim) if source is not None else vectors.shape
        backend = choose_backend(use_gpu)
        self.kind = (spec or IndexSpec()).resolve(self.rows, backend, dim=dim)
        self.query_chunk = query_chunk
        self._base: torch.Tensor | None = None
        self._index: Any = None
        self.vectors: np.ndarray | None = None
        """The vectors as one array, unless the index holds the only copy."""
        if source is not None and backend == "faiss-cpu" and self.kind in ("flat", "ivf"):
            self._index = _faiss_index(
                source.vectors, self.rows, dim, self.kind, backend=backend, pretrained=pretrained
            )
        else:
            if source is not None:  # IVF-PQ's codes are not the vectors; GPU indexes are not read back
                vectors = _every_vector(source, pretrained)
            self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
            if backend == "torch-cuda" and self.kind == "flat":
                self._base = torch.from_numpy(self.vectors).to("cuda")
                torch.cuda.synchronize()
                if self.query_chunk is None:
                    self.query_chunk = query_chunk_for(torch.cuda.mem_get_info()[0], self.rows, k or 1024)
            else:
                self._index = _faiss_index(
                    self.vectors.__getitem__, self.rows, dim, self.kind,
                    backend=backend, pretrained=pretrained,
                )  # fmt: skip
                backend = "faiss-cpu" if backend == "torch-cuda" else backend  # where it searches
        self.backend = f"{backend}/{self.kind}"
        # A source's fetches are its encoding, not the build: the caller counts them.
        self.build_seconds = time.perf_counter() - start - (source.seconds if source is not None else 0.0)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(m, k)`` float32 scores (best first) and int64 row positions of each query's top
        ``k`` (capped at the rows), -1 where fewer exist.

        Args:
            queries: ``(m, d)`` float32, L2-normalised.
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        k = min(k, self.rows)
        if self._base is not None:
            assert self.query_chunk is not None
            return torch_top_k(self._base, queries, k, self.query_chunk)
        # faiss' IVF search holds every query's probed cells at once (nprobe x 12 B a query):
        # at a calibrated nprobe of 1,024, 800 MB for a chunk of 65,536 queries.
        block = max(1, IVF_PROBE_BYTES // (12 * getattr(self._index, "nprobe", 1)))
        scores = np.empty((len(queries), k), dtype=np.float32)
        indices = np.empty((len(queries), k), dtype=np.int64)
        for lo in range(0, len(queries), block):
            scores[lo : lo + block], indices[lo : lo + block] = self._index.search(
                queries[lo : lo + block], k
            )
        return scores, indices

    def vectors_of(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions), d)`` float32 vectors of the indexed rows at ``positions``."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.vectors is not None:
            return self.vectors[positions]
        return self._index.reconstruct_batch(positions)

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search`'s answer from every row, whatever the kind (:func:`exact_top_k`):
        what an approximate index's recall is measured against."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        return exact_top_k(queries, self.vectors_of, self.rows, min(k, self.rows))

    def set_nprobe(self, nprobe: int) -> None:
        """Probe ``nprobe`` cells a query from now on (IVF kinds; a flat index has none)."""
        if self.kind in ("ivf", "ivfpq"):
            _set_nprobe(self._index, nprobe, on_gpu=self.backend.startswith("faiss-gpu"))


def training_rows(n: int, kind: str, seed: int) -> np.ndarray:
    """Sorted positions of the sample an index of ``kind`` over ``n`` vectors trains its IVF
    cells (and IVF-PQ its codebooks) on; none for flat."""
    if kind == "flat":
        return np.empty(0, dtype=np.int64)
    size = min(n, ivf_cells(n) * TRAIN_POINTS_PER_CELL)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def index_over_cells(centroids: np.ndarray, kind: str, pq_sample: np.ndarray | None = None) -> np.ndarray:
    """An empty ``ivf`` or ``ivfpq`` index over ``centroids`` (``(cells, d)`` float32 unit
    cells trained on a sample of every shard's vectors,
    :func:`~pipeline.mining.ivf_training.spherical_kmeans`), as ``faiss.serialize_index``
    writes it; ``ivfpq`` trains its codebooks on ``pq_sample`` (at least 256 rows of the
    vectors). Every shard fills a copy with its own vectors (:class:`PretrainedIndex`), so a
    vector is listed under the same cell whichever shard holds it, the shards' merged search is
    one index's, and a query probes ``nprobe`` cells of the whole corpus, not ``nprobe`` of
    each shard's."""
    import faiss  # deferred, as in choose_backend

    return faiss.serialize_index(_index_over_cells(centroids, kind, pq_sample))


def _index_over_cells(centroids: np.ndarray, kind: str, pq_sample: np.ndarray | None) -> Any:
    import faiss  # deferred, as in choose_backend

    cells, dim = centroids.shape
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    # With its quantizer holding every cell, an IVF index is trained (IVF-PQ still trains its
    # codebooks, on the residuals of its sample to their cells).
    if kind == "ivf":
        return faiss.IndexIVFFlat(quantizer, dim, cells, faiss.METRIC_INNER_PRODUCT)
    assert pq_sample is not None, "an IVF-PQ index trains its codebooks on a sample"
    index = faiss.IndexIVFPQ(quantizer, dim, cells, pq_bytes(dim), 8, faiss.METRIC_INNER_PRODUCT)
    index.train(np.ascontiguousarray(pq_sample, dtype=np.float32))
    return index


def _faiss_index(
    vectors_of: Callable[[np.ndarray], np.ndarray],
    n: int,
    dim: int,
    kind: str,
    *,
    backend: str,
    pretrained: PretrainedIndex | None,
) -> Any:
    """A faiss index of ``kind`` over the ``n`` vectors ``vectors_of`` gives: flat, or
    ``pretrained``'s (IVF kinds), the vectors added :data:`ADD_CHUNK_ROWS` at a time; for
    ``faiss-gpu``, split over the GPUs this process was given (``shard``: each holds a part of
    the vectors, not a copy)."""
    import faiss  # deferred, as in choose_backend

    if kind == "flat":
        sample, sampled = np.empty(0, dtype=np.int64), np.empty((0, dim), dtype=np.float32)
        index = faiss.IndexFlatIP(dim)
    else:
        assert pretrained is not None, "an IVF index fills cells trained over every shard"
        sample, sampled = pretrained.sample_rows, pretrained.sample_vectors
        index = faiss.deserialize_index(pretrained.index)
    if backend == "faiss-gpu":
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True
        index = faiss.index_cpu_to_all_gpus(index, co=options)
    for lo in range(0, n, ADD_CHUNK_ROWS):
        chunk = _vectors_between(
            lo, min(lo + ADD_CHUNK_ROWS, n), dim, sample=sample, sampled=sampled, vectors_of=vectors_of
        )
        index.add(chunk)
        del chunk
        release_free_heap()  # the chunk and its encoding's temporaries, between the growing lists
    del sampled
    if kind == "ivf" and backend == "faiss-cpu":
        index.make_direct_map()  # rows read back by position (VectorIndex.vectors_of)
    return index


def _every_vector(source: VectorSource, pretrained: PretrainedIndex | None) -> np.ndarray:
    """All of ``source``'s vectors in one array, the sample's taken from ``pretrained``."""
    if pretrained is None:
        return source.vectors(np.arange(source.rows))
    return _vectors_between(
        0,
        source.rows,
        source.dim,
        sample=pretrained.sample_rows,
        sampled=pretrained.sample_vectors,
        vectors_of=source.vectors,
    )


def _vectors_between(
    lo: int,
    hi: int,
    dim: int,
    *,
    sample: np.ndarray,
    sampled: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """``(hi - lo, dim)`` vectors of positions ``lo`` to ``hi``: those of the sample (sorted
    positions ``sample``, their vectors ``sampled``) from the sample, the rest fetched by
    ``vectors_of``, so a source computes none twice."""
    out = np.empty((hi - lo, dim), dtype=np.float32)
    first, last = np.searchsorted(sample, [lo, hi])
    out[sample[first:last] - lo] = sampled[first:last]
    fetched = np.ones(hi - lo, dtype=bool)
    fetched[sample[first:last] - lo] = False
    if fetched.any():
        out[fetched] = vectors_of(np.flatnonzero(fetched) + lo)
    return out


def _set_nprobe(index: Any, nprobe: int, *, on_gpu: bool) -> None:
    import faiss  # deferred, as in choose_backend

    space = faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()
    space.set_index_parameter(index, "nprobe", nprobe)


class ProbedIndex(Protocol):
    """An IVF index over ``rows`` vectors whose ``nprobe`` can be set and whose exact answer
    can be asked: one :class:`VectorIndex`, or the miner's shards under shared cells
    (:class:`~pipeline.mining.miner_shards.MinerShards`)."""

    rows: int

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(m, min(k, rows))`` scores, best first, and row positions (-1: none)."""
        ...

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top ``k`` from every row, whatever the index."""
        ...

    def set_nprobe(self, nprobe: int) -> None:
        """Probe ``nprobe`` cells a query from now on."""
        ...


def calibrate_nprobe(index: ProbedIndex, queries: np.ndarray, *, cells: int) -> tuple[int, float]:
    """Set ``index``'s ``nprobe`` (:func:`probe_until_recall`) on ``queries`` (a seeded sample
    of its own rows' vectors, :func:`calibration_rows`) against their exact top 10.

    Returns:
        The ``nprobe`` set and the sample's recall@10 with it.
    """
    k = min(10, index.rows)
    _, exact = index.exact_search(queries, k)
    return probe_until_recall(
        lambda chunk: index.search(chunk, k)[1], index.set_nprobe, queries, exact, cells=cells
    )


def calibration_rows(rows: int, seed: int) -> np.ndarray:
    """Sorted positions of the seeded :data:`CALIBRATION_QUERIES` rows that calibrate
    ``nprobe`` over ``rows`` vectors."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(rows, size=min(CALIBRATION_QUERIES, rows), replace=False))


def probe_until_recall(
    search: Callable[[np.ndarray], np.ndarray],
    set_nprobe: Callable[[int], None],
    queries: np.ndarray,
    exact: np.ndarray,
    *,
    cells: int,
) -> tuple[int, float]:
    """Set ``nprobe`` to :data:`NPROBE`, doubled until ``search`` (queries to their
    ``(m, k)`` found rows) finds :data:`RECALL_TARGET` of ``exact`` (``(m, k)`` their exact top
    ``k``) with 95% confidence (:func:`recall_lower_bound`), or every one of the ``cells`` is
    probed; then the last doubling is bisected to an eighth of its width for the fewest probes
    that still reach the target (a search's time grows with ``nprobe``, and a doubling
    overshoots by up to 2x). How clustered the vectors are decides it, not their number: real
    embeddings stay at :data:`NPROBE`; a random-weights model's (every pair above 0.97) found
    0.70 of their top 10 at 32 of 894 cells and 0.91 at 128 (50k rows).

    Returns:
        The ``nprobe`` set and the sample's mean recall with it.
    """
    k = exact.shape[1]

    def recall_at(nprobe: int) -> np.ndarray:
        set_nprobe(nprobe)
        found = search(queries)
        return np.array([len(np.intersect1d(a, b)) for a, b in zip(found, exact, strict=True)]) / k

    failed, nprobe = 0, min(NPROBE, cells)
    recall = recall_at(nprobe)
    while recall_lower_bound(recall) < RECALL_TARGET and nprobe < cells:
        failed, nprobe = nprobe, min(cells, nprobe * 2)
        recall = recall_at(nprobe)
    if failed and recall_lower_bound(recall) >= RECALL_TARGET:
        # More probes never find less, so the fewest that reach the target lie in (failed, nprobe].
        width = max(1, (nprobe - failed) // 8)
        while nprobe - failed > width:
            middle = (failed + nprobe) // 2
            if recall_lower_bound(middle_recall := recall_at(middle)) >= RECALL_TARGET:
                nprobe, recall = middle, middle_recall
            else:
                failed = middle
    set_nprobe(nprobe)
    return nprobe, float(recall.mean())


def recall_lower_bound(per_query: np.ndarray) -> float:
    """The one-sided 95% lower bound of the mean of ``per_query`` recalls: their mean less
    :data:`RECALL_CONFIDENCE_Z` standard errors (the mean itself for a single query)."""
    if len(per_query) < 2:
        return float(per_query.mean()) if len(per_query) else 1.0
    spread = per_query.std(ddof=1) / np.sqrt(len(per_query))
    return float(per_query.mean() - RECALL_CONFIDENCE_Z * spread)


def exact_top_k(
    queries: np.ndarray,
    vectors_of: Callable[[np.ndarray], np.ndarray],
    rows: int,
    k: int,
    block_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(len(queries), k)`` scores, best first, and positions among ``rows`` vectors with the
    largest inner products with each query: faiss' exact search over blocks of a database
    (``faiss.contrib.exhaustive_search.knn_ground_truth``: a flat index a block, its answers
    kept in a ``ResultHeap``), on the CPU, the blocks fetched ``block_rows`` positions at a
    time by ``vectors_of`` (an array's rows, or the miner's shards:
    :meth:`EncodedTexts.vectors`); None: as many as :data:`EXACT_BLOCK_BYTES` of vectors."""
    import faiss  # deferred, as in choose_backend
    from faiss.contrib.exhaustive_search import knn_ground_truth

    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if block_rows is None:
        block_rows = max(k, EXACT_BLOCK_BYTES // (4 * queries.shape[1]))
    blocks = (vectors_of(np.arange(lo, min(lo + block_rows, rows))) for lo in range(0, rows, block_rows))
    return knn_ground_truth(queries, blocks, k, metric_type=faiss.METRIC_INNER_PRODUCT, ngpu=0)


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
    import faiss  # deferred, as in choose_backend

    def widened(values: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(values, ((0, 0), (0, k - values.shape[1])), constant_values=fill)

    scores = np.stack([widened(np.where(r >= 0, s, -np.inf), -np.inf) for s, r in parts])
    rows = np.stack([widened(r, -1) for _, r in parts])
    scores, rows = faiss.merge_knn_results(scores.astype(np.float32), rows.astype(np.int64), keep_max=True)
    return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows  # faiss pads with -FLT_MAX


def torch_top_k(
    base: torch.Tensor, queries: np.ndarray, k: int, query_chunk: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of ``queries`` (``(m, d)`` float32) by inner product with the rows of
    ``base`` (``(n, d)`` on its device): chunked matrix products and ``topk``, the
    ``torch-cuda`` backend's search (faiss-gpu wheels need CUDA 12, torch's are CUDA 13)."""
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    for lo in range(0, len(queries), query_chunk):
        sims = torch.from_numpy(queries[lo : lo + query_chunk]).to(base.device) @ base.T
        top = torch.topk(sims, k, dim=1)
        scores[lo : lo + query_chunk] = top.values.cpu().numpy()
        indices[lo : lo + query_chunk] = top.indices.cpu().numpy()
    return scores, indices
