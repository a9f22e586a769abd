"""Precomputed vectors as a refresh reads the texts (an :class:`~pipeline.mining.encoded_texts.
EncodedTexts`), and :func:`mine_hard_negatives` over them, for tests and benches that mine
without a model: every vector in one array of this process, and one index over the candidates'.
The miner's own are its shards (:class:`~pipeline.mining.miner_shards.MinerShards`), and both
jobs mine through them."""

from __future__ import annotations

import time

import numpy as np
import torch

from pipeline.mining.corpus_partitions import RankedRows
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.hard_negatives import MinedNegatives, Searched, SearchSettings, negatives_among
from pipeline.mining.index import (
    IndexSpec,
    PretrainedIndex,
    VectorIndex,
    VectorSource,
    calibrate_nprobe,
    calibration_rows,
    choose_backend,
    index_over_cells,
    ivf_cells,
    training_rows,
)
from pipeline.mining.ivf_training import SampleOnDevice, nearest_cells, spherical_kmeans
from pipeline.mining.negatives import NegativeFilters
from pipeline.mining.text_keys import KnownPositives


class EmbeddedTexts:
    """Every text's vector in one array, and an index over the candidates' (one process).

    Args:
        embeddings: ``(texts, dim)`` the corpus under the newest weights.
        candidates: sorted positions searches may return (the pool); their ordinals are
            what a search returns. None: every text (the corpus task), with no copy.
        search: index kind, device and ``top_k``.
        seed: the IVF training sample.
        keys: ``(texts,)`` their text keys (equal: the same sentence); None: every text distinct.
    """

    def __init__(
        self,
        embeddings: np.ndarray,
        candidates: np.ndarray | None,
        search: SearchSettings,
        seed: int,
        keys: np.ndarray | None = None,
    ):
        self.embeddings = embeddings
        self.keys = np.arange(len(embeddings)) if keys is None else np.asarray(keys, dtype=np.int64)
        self.assignment: np.ndarray | None = None
        self.ranked: RankedRows | None = None
        self.batches: dict[int, np.ndarray] = {}
        pool = embeddings if candidates is None else embeddings[candidates]
        kind = search.index_kind(len(pool), pool.shape[1])
        self.index = vector_index(pool, kind=kind, seed=seed, use_gpu=search.use_gpu, k=search.top_k)
        self.rows, self.backend, self.build_seconds = (
            self.index.rows,
            self.index.backend,
            self.index.build_seconds,
        )
        self.kind, self.dim = kind, pool.shape[1]

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        return self.embeddings[positions]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(queries, k)

    def search_positions(self, positions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.search(self.vectors(positions), k)

    def pair_scores(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", self.vectors(left), self.vectors(right)).astype(np.float32)

    def keys_of(self, positions: np.ndarray) -> np.ndarray:
        return self.keys[positions]

    def cell_counts(self, centroids: np.ndarray) -> np.ndarray:
        self.assignment = nearest_cells(torch.from_numpy(self.embeddings), centroids)[0].numpy()
        return np.bincount(self.assignment, minlength=len(centroids))[None, :]

    def order_by_cell(self, offsets: np.ndarray) -> None:
        self.ranked = RankedRows(self.assignment, 0, offsets[0])

    def rows_ranked(self, lo: int, hi: int) -> np.ndarray:
        return self.ranked.between(lo, hi)

    def record_batches(
        self, positions: np.ndarray, batches: np.ndarray, *, version: int, previous: int | None
    ) -> np.ndarray:
        if version not in self.batches:
            self.batches = {v: b for v, b in self.batches.items() if v == previous}
            self.batches[version] = np.full(len(self.embeddings), -1, dtype=np.int32)
        self.batches[version][positions] = batches
        earlier = self.batches.get(previous) if previous is not None else None
        return earlier[positions] if earlier is not None else np.full(len(positions), -1, dtype=np.int32)


def mine_hard_negatives(
    *,
    anchor_vectors: np.ndarray,
    positive_vectors: np.ndarray,
    pool_vectors: np.ndarray | VectorIndex | EncodedTexts,
    anchor_keys: np.ndarray,
    positive_keys: np.ndarray,
    pool_keys: np.ndarray,
    filters: NegativeFilters,
    search: SearchSettings,
    seed: int | list[int],
    exclude_known_positives: bool = True,
    known_positives: KnownPositives | None = None,
) -> MinedNegatives:
    """Mine each anchor's hard negatives among the pool of precomputed vectors: the search in
    this process, then :func:`~pipeline.mining.hard_negatives.negatives_among` as the miner's
    shards' top lists go through it.

    Args:
        anchor_vectors, positive_vectors: ``(n, dim)`` L2-normalised embeddings of each row's
            anchor and positive.
        pool_vectors: ``(p, dim)`` L2-normalised embeddings of the candidate texts, or an index
            already built over them (a :class:`~pipeline.mining.index.VectorIndex`, or shards of one).
        search: ``top_k``, index and device.
        seed: the IVF training sample, and as
            :func:`~pipeline.mining.hard_negatives.negatives_among`'s.
        anchor_keys, positive_keys, pool_keys, filters, known_positives: as
            :func:`~pipeline.mining.hard_negatives.negatives_among`'s.
        exclude_known_positives: without ``known_positives``, exclude the given rows' own
            known pairs (False: only each row's own positive).

    Returns:
        What :func:`~pipeline.mining.hard_negatives.negatives_among` returns.
    """
    index = pool_vectors
    if isinstance(pool_vectors, np.ndarray):
        kind = search.index_kind(len(pool_vectors), pool_vectors.shape[1])
        index = vector_index(pool_vectors, kind=kind, seed=seed, use_gpu=search.use_gpu, k=search.top_k)
    started = time.perf_counter()
    found = index.search(anchor_vectors, search.top_k)
    searched = Searched(*found, seconds=time.perf_counter() - started, backend=index.backend,
                        index_seconds=index.build_seconds)  # fmt: skip
    positive_scores = np.einsum("ij,ij->i", anchor_vectors, positive_vectors).astype(np.float32)
    if known_positives is None and exclude_known_positives:
        base = int(max(k.max(initial=0) for k in (anchor_keys, positive_keys, pool_keys))) + 1
        known_positives = KnownPositives.of(anchor_keys, positive_keys, base)
    return negatives_among(
        searched, positive_scores=positive_scores, anchor_keys=anchor_keys, positive_keys=positive_keys,
        pool_keys=pool_keys, filters=filters, seed=seed, known_positives=known_positives,
    )  # fmt: skip


def vector_index(
    vectors: np.ndarray | VectorSource,
    *,
    kind: str = "auto",
    seed: int | list[int] = 0,
    use_gpu: bool = False,
    k: int = 0,
    query_chunk: int | None = None,
) -> VectorIndex:
    """One :class:`~pipeline.mining.index.VectorIndex` over one array (or source) of
    L2-normalised vectors, as the miner's one shard builds it: IVF kinds train their cells on
    the seeded sample (:func:`~pipeline.mining.index.training_rows`) by the same k-means, on
    the GPU where the search runs there, and calibrate ``nprobe`` on the seeded rows."""
    source = vectors if isinstance(vectors, VectorSource) else None
    rows, dim = (source.rows, source.dim) if source is not None else vectors.shape
    kind = IndexSpec(kind).resolve(rows, choose_backend(use_gpu), dim=dim)
    pretrained = None
    if kind != "flat":
        sample = training_rows(rows, kind, seed)
        sampled = source.vectors(sample) if source is not None else vectors[sample]
        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        centroids = spherical_kmeans(SampleOnDevice(sampled, device), ivf_cells(rows), seed=seed)
        pretrained = PretrainedIndex(index_over_cells(centroids, kind, sampled), sample, sampled)
    index = VectorIndex(
        vectors, use_gpu=use_gpu, spec=IndexSpec(kind), query_chunk=query_chunk, k=k, pretrained=pretrained
    )
    if kind != "flat":
        calibrate_nprobe(index, index.vectors_of(calibration_rows(rows, seed)), cells=ivf_cells(rows))
    return index
