"""The numbers that say how hard and how safe a plan is (the plan itself: ``planning.py``)."""

from __future__ import annotations

import numpy as np

from pipeline.batching.plan import BatchPlan
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.mining_metrics import random_pairs, similarity_percentiles
from pipeline.mining.negatives import FilteredCandidates


class CandidateTotals:
    """What a corpus refresh logs of its rows' neighbours and their fates, added up partition
    after partition (:mod:`~pipeline.mining.corpus_partitions`), so that no step holds every
    row's neighbours at once."""

    def __init__(self) -> None:
        self.top1_sum, self.top1_count = 0.0, 0
        self.candidates = self.kept = self.flagged = self.pairs_in_batches = self.outside = 0
        self.removed: dict[str, int] = {}
        self.partitions = 0

    def add(
        self,
        *,
        rows: np.ndarray,
        scores: np.ndarray,
        indices: np.ndarray,
        filtered: FilteredCandidates,
        inside: np.ndarray,
        false_negatives: np.ndarray,
        plan: BatchPlan,
    ) -> None:
        """One partition's share.

        Args:
            rows: ``(m,)`` the partition's corpus positions.
            scores, indices: ``(m, k)`` its rows' search over the corpus (each row among its own
                neighbours).
            filtered: each candidate's fate under the negative filters.
            inside: ``(m, k)`` the candidate is a row of the partition.
            false_negatives: ``(m, k)`` each row's flagged false negatives in the partition, as
                positions of ``plan``'s rows, -1 elsewhere.
            plan: the partition's batches, in its own positions.
        """
        top1 = _first_valid_scores(scores, np.where(filtered.duplicate, -1, indices))
        self.top1_sum += float(top1.sum())
        self.top1_count += len(top1)
        self.candidates += int(filtered.candidates)
        self.kept += int(filtered.allowed.sum())
        for name, count in filtered.removed.items():
            self.removed[name] = self.removed.get(name, 0) + int(count)
        self.flagged += int((filtered.false_negative & (indices != rows[:, None])).sum())
        self.pairs_in_batches += false_negative_pairs(plan, false_negatives)
        # What the partitions cost: neighbours the plan could have used in one partition.
        self.outside += int((filtered.allowed & ~inside).sum())
        self.partitions += 1

    def add_totals(self, other: CandidateTotals) -> None:
        """Another partition's totals, counted apart (where it was planned), added to these."""
        self.top1_sum += other.top1_sum
        self.top1_count += other.top1_count
        self.candidates += other.candidates
        self.kept += other.kept
        for name, count in other.removed.items():
            self.removed[name] = self.removed.get(name, 0) + count
        self.flagged += other.flagged
        self.pairs_in_batches += other.pairs_in_batches
        self.outside += other.outside
        self.partitions += other.partitions

    def metrics(self) -> dict[str, float]:
        """The ``mining/`` metrics of every partition added."""
        top1_mean = self.top1_sum / self.top1_count if self.top1_count else float("nan")
        return {
            "mining/top1_similarity_mean": top1_mean,
            "mining/candidates": float(self.candidates),
            "mining/kept": float(self.kept),
            **{f"mining/removed_{name}": float(count) for name, count in self.removed.items()},
            "mining/false_negatives_flagged": float(self.flagged),
            "mining/false_negative_pairs_in_batches": float(self.pairs_in_batches),
            "mining/partitions": float(self.partitions),
            "mining/kept_outside_partition": float(self.outside),
        }


def plan_metrics(
    texts: EncodedTexts, plan: BatchPlan, *, previous: BatchPlan | None, seed: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """What a corpus refresh logs of its whole plan, and the similarities its histogram draws.

    Args:
        texts: the corpus the plan orders, under the weights it was planned with (the
            vectors of the rows the samples of pairs name are fetched from it).
        plan: the next epoch's batches.
        previous: the last refresh's plan, for the churn (``None``: the first refresh).
        seed: seeds the samples of pairs.

    Returns:
        ``mining/`` metrics, and ``{"random pairs": ..., "mined plan": ...}`` cosine similarities.
    """
    metrics = {}
    if previous is not None:
        metrics["mining/churn"] = plan_churn(previous, plan)
    in_batch = in_batch_pair_similarities(texts, plan, seed)
    # Random pairs of rows are what random batches hold: the baseline the plan is read against.
    sample, partners = random_pairs(len(plan.rows), len(plan.rows), seed)
    random_similarities = np.einsum("ij,ij->i", texts.vectors(sample), texts.vectors(partners))
    metrics |= {f"mining/batch_similarity_{k}": v for k, v in similarity_percentiles(in_batch).items()}
    metrics["mining/random_batch_similarity_mean"] = float(random_similarities.mean())
    return metrics, {"random pairs": random_similarities, "mined plan": in_batch}


def in_batch_pair_similarities(
    texts: EncodedTexts, plan: BatchPlan, seed: int, max_batches: int = 2000
) -> np.ndarray:
    """Cosine similarity of every distinct pair inside the plan's batches (a seeded sample
    of at most ``max_batches`` batches): the similarity of the negatives the loss sees."""
    batches = plan.batches()
    if len(batches) > max_batches:
        picked = np.random.default_rng(seed).choice(len(batches), size=max_batches, replace=False)
        batches = [batches[i] for i in picked]
    if not batches:
        return np.empty(0, dtype=np.float32)
    # One fetch for every sampled row: the rows may sit in the miner's shards.
    vectors = np.split(texts.vectors(np.concatenate(batches)), np.cumsum([len(b) for b in batches])[:-1])
    parts = []
    for e in vectors:
        upper = np.triu_indices(len(e), k=1)
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
