"""The numbers that say how hard and how safe a plan is (the plan itself: ``planning.py``)."""

from __future__ import annotations

import numpy as np

from pipeline.batching.plan import BatchPlan


def in_batch_pair_similarities(
    embeddings: np.ndarray, plan: BatchPlan, seed: int, max_batches: int = 2000
) -> np.ndarray:
    """Cosine similarity of every distinct pair inside the plan's batches (a seeded sample
    of at most ``max_batches`` batches): the similarity of the negatives the loss sees."""
    batches = plan.batches()
    if len(batches) > max_batches:
        picked = np.random.default_rng(seed).choice(len(batches), size=max_batches, replace=False)
        batches = [batches[i] for i in picked]
    parts = []
    for rows in batches:
        e = embeddings[rows]
        upper = np.triu_indices(len(rows), k=1)
        parts.append((e @ e.T)[upper])
    return np.concatenate(parts)


def false_negative_pairs(plan: BatchPlan, false_negatives: np.ndarray) -> int:
    """How many (row, flagged false negative) pairs ended up in the same batch."""
    batch_of = np.empty(len(plan.rows), dtype=np.int64)
    batch_of[plan.rows] = np.repeat(np.arange(plan.num_batches), plan.sizes)
    valid = false_negatives >= 0
    rows = np.broadcast_to(np.arange(len(false_negatives))[:, None], false_negatives.shape)[valid]
    return int((batch_of[rows] == batch_of[false_negatives[valid]]).sum())


def plan_churn(previous: BatchPlan, current: BatchPlan) -> float:
    """Share of in-batch negative pairs in ``current`` that were not together in ``previous``."""
    previous_batch = np.empty(len(previous.rows), dtype=np.int64)
    previous_batch[previous.rows] = np.repeat(np.arange(previous.num_batches), previous.sizes)
    kept_pairs = total_pairs = 0
    for rows in current.batches():
        _, counts = np.unique(previous_batch[rows], return_counts=True)
        kept_pairs += int((counts * (counts - 1)).sum())
        total_pairs += len(rows) * (len(rows) - 1)
    return 1.0 - kept_pairs / max(total_pairs, 1)


def _first_valid_scores(scores: np.ndarray, cleaned: np.ndarray) -> np.ndarray:
    valid = cleaned >= 0
    has = valid.any(axis=1)
    first = valid.argmax(axis=1)
    return scores[np.arange(len(scores)), first][has]
