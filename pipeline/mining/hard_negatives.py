"""``mine_hard_negatives``: the one mining function. The offline job (``jobs/mine.py``) and
training's miner both call it: vectors in, a table of negatives out.

Mining is four steps, each visible in the function body: search each anchor's ``top_k``
nearest pool vectors (FAISS, :func:`~pipeline.mining.index.knn_search`), mark the candidates
that are the anchor's own text or one of its known positives, filter them
(:mod:`pipeline.mining.negatives`), and keep ``num_negatives`` per anchor. The result is data,
not a control object: a :class:`MinedNegatives` table with one row per anchor. What a run logs
of a mining is computed from that table afterwards, in one place (:func:`mining_metrics`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.config.schema import Config
from pipeline.mining.index import IndexSpec, knn_search
from pipeline.mining.negatives import FILTERS, NegativeFilters, select_negatives
from pipeline.mining.text_keys import duplicate_mask, known_positive_mask

RANDOM_PAIRS = 20_000
"""Most (anchor, random pool row) pairs in the baseline sample of :func:`random_pair_similarities`."""


@dataclass(frozen=True)
class SearchSettings:
    """How the nearest neighbours are searched: ``mining.top_k``, the index and the device."""

    top_k: int = 64
    index: IndexSpec = field(default_factory=IndexSpec)
    use_gpu: bool = False

    @classmethod
    def from_config(cls, cfg: Config) -> SearchSettings:
        mining = cfg.mining
        return cls(top_k=mining.top_k, index=IndexSpec.from_section(mining), use_gpu=mining.num_gpus > 0)


@dataclass(frozen=True)
class MinedNegatives:
    """What one mining found, one row per anchor, in the order the anchors were given.

    ``table`` columns: ``negatives`` (``num_negatives`` pool positions, -1 where the filters
    left too few), ``scores`` (their cosine similarity to the anchor, NaN where missing),
    ``positive_score`` (anchor-positive cosine), ``candidates`` (neighbours searched),
    ``kept`` (candidates that passed every filter) and ``removed_<filter>`` for each filter of
    :data:`~pipeline.mining.negatives.FILTERS`, in the order they apply.
    """

    table: pa.Table
    backend: str
    """The search backend that ran (``faiss-cpu``, ``faiss-gpu``, ``torch-cuda``)."""
    seconds: dict[str, float]
    """``index``, ``search`` and ``filter`` wall time."""

    def negatives(self) -> np.ndarray:
        """``(anchors, num_negatives)`` int64 pool positions, -1 where missing."""
        return _matrix(self.table.column("negatives"), np.int64)

    def scores(self) -> np.ndarray:
        """``(anchors, num_negatives)`` float32 cosine similarities, NaN where missing."""
        return _matrix(self.table.column("scores"), np.float32)

    def total(self, column: str) -> int:
        """A count column summed over the anchors."""
        return int(pa.compute.sum(self.table.column(column)).as_py() or 0)

    @property
    def removed(self) -> dict[str, int]:
        """Candidates each filter removed, over all anchors, in the order the filters apply."""
        return {name: self.total(f"removed_{name}") for name in FILTERS}

    @property
    def complete(self) -> np.ndarray:
        """``(anchors,)`` bool: the anchor got all its negatives."""
        return (self.negatives() >= 0).all(axis=1)


def _matrix(column: pa.ChunkedArray, dtype: type) -> np.ndarray:
    flat = pa.concat_arrays([chunk.flatten() for chunk in column.chunks]) if column.num_chunks else []
    return np.asarray(flat, dtype=dtype).reshape(len(column), -1)


def mine_hard_negatives(
    *,
    anchor_vectors: np.ndarray,
    positive_vectors: np.ndarray,
    pool_vectors: np.ndarray,
    anchor_keys: np.ndarray,
    positive_keys: np.ndarray,
    pool_keys: np.ndarray,
    filters: NegativeFilters,
    search: SearchSettings,
    seed: int,
    exclude_known_positives: bool = True,
) -> MinedNegatives:
    """Mine each anchor's hard negatives among the pool.

    Args:
        anchor_vectors, positive_vectors: ``(n, dim)`` L2-normalised embeddings of each row's
            anchor and positive.
        pool_vectors: ``(p, dim)`` L2-normalised embeddings of the candidate texts.
        anchor_keys, positive_keys, pool_keys: ``(n,)``, ``(n,)``, ``(p,)``
            :func:`~pipeline.mining.text_keys.text_keys` of the same texts, in one key space:
            equal keys are the same sentence up to case, accents and punctuation.
        filters: which candidates are acceptable negatives and how many to keep.
        search: ``top_k``, index and device.
        seed: the IVF training sample and ``sampling: random``.
        exclude_known_positives: a candidate that is the positive of *any* row with the same
            anchor text is removed (retrieval pairs: several positives per anchor, texts that
            are the positive of several anchors), not only the row's own positive.

    Returns:
        One row per anchor: its negatives as pool positions, their scores, and what each
        filter removed (:class:`MinedNegatives`).
    """
    k = min(search.top_k, len(pool_vectors))
    knn = knn_search(
        pool_vectors, k, use_gpu=search.use_gpu, spec=search.index, seed=seed, queries=anchor_vectors
    )
    t0 = time.perf_counter()
    duplicate = duplicate_mask(knn.indices, anchor_keys, positive_keys, pool_keys)
    known = None
    if exclude_known_positives:
        known = known_positive_mask(knn.indices, anchor_keys, pool_keys, anchor_keys, positive_keys)
    positive_scores = np.einsum("ij,ij->i", anchor_vectors, positive_vectors).astype(np.float32)
    chosen = select_negatives(
        knn.indices, knn.scores, positive_scores, duplicate, filters, seed=seed, known_positive=known
    )
    m = chosen.indices.shape[1]
    table = pa.table(
        {
            "negatives": pa.FixedSizeListArray.from_arrays(pa.array(chosen.indices.ravel(), pa.int64()), m),
            "scores": pa.FixedSizeListArray.from_arrays(
                pa.array(chosen.scores.ravel().astype(np.float32), pa.float32()), m
            ),
            "positive_score": positive_scores,
            **chosen.per_row,
        }
    )
    seconds = {"index": knn.index_seconds, "search": knn.search_seconds, "filter": time.perf_counter() - t0}
    return MinedNegatives(table, knn.backend, seconds)


def random_pair_similarities(
    anchor_vectors: np.ndarray, pool_vectors: np.ndarray, seed: int, max_pairs: int = RANDOM_PAIRS
) -> np.ndarray:
    """Cosine similarity of ``min(max_pairs, anchors)`` seeded random anchors (with
    replacement) with as many random pool rows: the baseline mined negatives are read against."""
    rng = np.random.default_rng(seed)
    sample = rng.integers(len(anchor_vectors), size=min(max_pairs, len(anchor_vectors)))
    partners = rng.integers(len(pool_vectors), size=len(sample))
    return np.einsum("ij,ij->i", anchor_vectors[sample], pool_vectors[partners])


def similarity_percentiles(scores: np.ndarray) -> dict[str, float]:
    """``mean``, ``p10``, ``p50`` and ``p90`` of ``scores`` (empty when there are none)."""
    if not len(scores):
        return {}
    return {
        "mean": float(scores.mean()),
        **{f"p{q}": float(np.percentile(scores, q)) for q in (10, 50, 90)},
    }


def mining_metrics(mined: MinedNegatives, *, random_pairs: np.ndarray, pool_size: int) -> dict[str, float]:
    """What a run logs of one mining, from its table: the offline job's ``mining/`` metrics and
    a training refresh's row of ``mining/refreshes.json`` (which adds its encode time, version
    and churn).

    ``mining/passed_<filter>`` counts the candidates still in the running after each filter, to
    read beside ``mining/removed_<filter>``: where a run's negatives were lost.
    """
    found = mined.scores()[mined.negatives() >= 0]
    removed = mined.removed
    passed, left = {}, mined.total("candidates")
    for name in FILTERS:
        left -= removed[name]
        passed[name] = left
    return {
        **{f"mining/{stage}_s": seconds for stage, seconds in mined.seconds.items()},
        "mining/corpus_size": float(pool_size),
        "mining/candidates": float(mined.total("candidates")),
        "mining/kept": float(mined.total("kept")),
        **{f"mining/removed_{name}": float(count) for name, count in removed.items()},
        **{f"mining/passed_{name}": float(count) for name, count in passed.items()},
        "mining/selected": float(len(found)),
        "mining/anchors_short": float((~mined.complete).sum()),
        "mining/positive_similarity_mean": float(np.mean(mined.table.column("positive_score"))),
        "mining/random_pair_similarity_mean": float(random_pairs.mean())
        if len(random_pairs)
        else float("nan"),
        **{f"mining/negative_similarity_{k}": v for k, v in similarity_percentiles(found).items()},
    }
