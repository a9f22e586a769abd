"""Supervised mining over (anchor, positive) rows, as both the training miner's the pairs task
and the offline job (``jobs/mine.py``) run it: each anchor's negatives among the distinct
positives, with the random-pair baseline and the numbers both report.

Rows are positions in one array of distinct texts (``vectors``, ``keys``): the training
miner's tokenized corpus, or the offline job's encoded pool followed by the anchors that
are not in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipeline.mining.index import IndexSpec, KnnResult, knn_search
from pipeline.mining.negatives import NegativeFilters, SelectedNegatives, select_negatives
from pipeline.mining.text_keys import duplicate_mask, known_positive_mask

RANDOM_PAIRS = 20_000
"""Most (anchor, random candidate) pairs in the baseline sample."""


@dataclass
class MinedAnchors:
    """Each anchor's negatives, and what they are compared with."""

    selected: SelectedNegatives
    """Negatives as positions in ``pool`` (not in ``vectors``), -1 where an anchor has too few."""
    positive_scores: np.ndarray
    """``(n,)`` anchor-positive cosine similarity."""
    random_pairs: np.ndarray
    """Cosine similarity of a seeded sample of anchors with random pool rows: the baseline
    the mined negatives' similarity is read against."""
    knn: KnnResult
    filter_seconds: float
    """Time spent masking duplicates and selecting negatives (index and search excluded)."""


def mine_anchors(
    vectors: np.ndarray,
    keys: np.ndarray,
    anchor: np.ndarray,
    positive: np.ndarray,
    pool: np.ndarray,
    filters: NegativeFilters,
    k: int,
    spec: IndexSpec,
    use_gpu: bool,
    seed: int,
    baseline_seed: int,
    exclude_known_positives: bool = True,
) -> MinedAnchors:
    """Mine each anchor's negatives among the ``pool`` rows and sample the random baseline.

    Args:
        vectors: ``(texts, dim)`` L2-normalised embeddings of the distinct texts.
        keys: ``(texts,)`` :func:`~pipeline.mining.text_keys.text_keys` of the same texts.
        anchor, positive: per row, the positions of its anchor and positive text.
        pool: positions of the candidate texts (the distinct positives).
        filters, k, spec, use_gpu, seed: as :func:`mine_anchor_negatives`.
        baseline_seed: seeds the random-pair sample (fixed across refreshes, so that their
            baselines compare).
        exclude_known_positives: remove every positive any row gives an anchor's text from
            its candidates, not only the row's own (retrieval pairs: several positives per
            anchor, texts that are the positive of several anchors).

    Returns:
        The selected negatives (pool positions), the anchor-positive and random-pair
        similarities, the search result and the filtering time.
    """
    anchor_vectors, pool_vectors = vectors[anchor], vectors[pool]
    known_pairs = (keys[anchor], keys[positive]) if exclude_known_positives else None
    t0 = time.perf_counter()
    mined = mine_anchor_negatives(
        anchor_vectors, vectors[positive], pool_vectors, keys[anchor], keys[positive], keys[pool],
        filters, k, spec=spec, use_gpu=use_gpu, seed=seed, known_pairs=known_pairs,
    )  # fmt: skip
    knn = mined.knn
    filter_seconds = time.perf_counter() - t0 - knn.index_seconds - knn.search_seconds
    random_pairs = random_pair_similarities(anchor_vectors, pool_vectors, baseline_seed)
    return MinedAnchors(mined.selected, mined.positive_scores, random_pairs, knn, filter_seconds)


@dataclass
class AnchorNegatives:
    selected: SelectedNegatives
    """Negatives as positions in the pool."""
    positive_scores: np.ndarray
    """``(n,)`` anchor-positive similarity."""
    knn: KnnResult


def mine_anchor_negatives(
    anchor_vectors: np.ndarray,
    positive_vectors: np.ndarray,
    pool_vectors: np.ndarray,
    anchor_keys: np.ndarray,
    positive_keys: np.ndarray,
    pool_keys: np.ndarray,
    filters: NegativeFilters,
    k: int,
    spec: IndexSpec | None = None,
    use_gpu: bool = False,
    seed: int = 0,
    known_pairs: tuple[np.ndarray, np.ndarray] | None = None,
) -> AnchorNegatives:
    """Search each anchor's ``k`` nearest pool vectors and select its negatives.

    The one code path of supervised mining, shared by the offline job and the training
    miner's the pairs task. Vectors are L2-normalised; keys are
    :func:`~pipeline.mining.text_keys.duplicate_mask` keys (one per normalised text) for the
    anchors, their positives and the pool. ``known_pairs``: the (anchor, positive) text keys
    of every known positive pair; a candidate that is one of its anchor's is removed
    (:func:`~pipeline.mining.text_keys.known_positive_mask`).
    """
    knn = knn_search(
        pool_vectors, min(k, len(pool_vectors)), use_gpu=use_gpu, spec=spec, seed=seed, queries=anchor_vectors
    )
    duplicate = duplicate_mask(knn.indices, anchor_keys, positive_keys, pool_keys)
    known = None
    if known_pairs is not None:
        known = known_positive_mask(knn.indices, anchor_keys, pool_keys, *known_pairs)
    positive_scores = np.einsum("ij,ij->i", anchor_vectors, positive_vectors)
    selected = select_negatives(
        knn.indices, knn.scores, positive_scores, duplicate, filters, seed=seed, known_positive=known
    )
    return AnchorNegatives(selected, positive_scores, knn)


def random_pair_similarities(
    anchor_vectors: np.ndarray, pool_vectors: np.ndarray, seed: int, max_pairs: int = RANDOM_PAIRS
) -> np.ndarray:
    """Cosine similarity of ``min(max_pairs, anchors)`` seeded random anchors (with
    replacement) with as many random pool rows, anchors drawn first."""
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


def random_pool_negatives(
    keys: np.ndarray, anchor: np.ndarray, positive: np.ndarray, pool: np.ndarray, count: int, seed: int
) -> np.ndarray:
    """``count`` random pool texts per anchor, to mix with its mined negatives.

    Mined negatives alone can be too hard, or false negatives the filters missed; mixing in
    random ones is what made self-mined negatives pay off in tevatron #43. A draw that is the
    same text as the anchor or its positive is redrawn (a few rounds), and left out (-1) if
    it still is: a tiny pool of near-identical texts. A known positive of the anchor (another
    row's positive for the same anchor text) is redrawn the same way.

    Args:
        keys: ``(texts,)`` :func:`~pipeline.mining.text_keys.text_keys` of the corpus texts.
        anchor, positive: ``(n,)`` each row's anchor and positive text positions.
        pool: positions of the candidate texts (the distinct positives).
        count: random negatives per anchor.
        seed: makes the draw deterministic.

    Returns:
        ``(n, count)`` int64 text positions, -1 where no acceptable draw was found.
    """
    rng = np.random.default_rng(seed)
    n = len(anchor)
    drawn = pool[rng.integers(0, len(pool), size=(n, count))]

    def clashes() -> np.ndarray:
        same = duplicate_mask(drawn, keys[anchor], keys[positive], keys)
        return same | known_positive_mask(drawn, keys[anchor], keys, keys[anchor], keys[positive])

    for _ in range(8):
        clash = clashes()
        if not clash.any():
            break
        drawn[clash] = pool[rng.integers(0, len(pool), size=int(clash.sum()))]
    return np.where(clashes(), -1, drawn).astype(np.int64)
