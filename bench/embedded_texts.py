"""Precomputed vectors as a refresh reads the texts (an :class:`~pipeline.mining.encoded_texts.
EncodedTexts`), for tests and benches that mine without a model: every vector in one array of
this process, and one index over the candidates'. The miner's own are its shards
(:class:`~pipeline.mining.miner_shards.MinerShards`)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec, VectorIndex
from pipeline.mining.ivf_training import nearest_cells


class EmbeddedTexts:
    """Every text's vector in one array, and an index over the candidates' (one process).

    Args:
        embeddings: ``(texts, dim)`` the corpus under the newest weights.
        candidates: sorted positions searches may return (the pool); their ordinals are
            what a search returns. None: every text (the corpus task), with no copy.
        search: index kind, device and ``top_k``.
        seed: the IVF training sample.
    """

    def __init__(
        self, embeddings: np.ndarray, candidates: np.ndarray | None, search: SearchSettings, seed: int
    ):
        self.embeddings = embeddings
        pool = embeddings if candidates is None else embeddings[candidates]
        kind = search.index_kind(len(pool), pool.shape[1])
        self.index = VectorIndex(
            pool, use_gpu=search.use_gpu, spec=IndexSpec(kind), seed=seed, k=search.top_k
        )
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

    def nearest(self, centroids: np.ndarray) -> np.ndarray:
        return nearest_cells(torch.from_numpy(self.embeddings), centroids)[0].numpy()
