"""The numbers that say how hard and how safe a plan is (the plan itself: ``planning.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from pipeline.batching.plan import BatchPlan
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.mining_metrics import random_pairs, similarity_percentiles
from pipeline.mining.negatives import FilteredCandidates


@dataclass
class CandidateTotals:
    """What a corpus refresh logs of its rows' neighbours and their fates, one partition's
    (:meth:`of_partition`, where it was planned) added to the others' (:meth:`add`), so that no step
    holds every row's neighbours at once."""

    top1_sum: float = 0.0
    top1_count: int = 0
    candidates: int = 0
    kept: int = 0
    flagged: int = 0
    pairs_in_batches: int = 0
    outside: int = 0
    """Neighbours the filters kept but in another partition: what the partitions cost."""
    partitions: int = 0
    removed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_partition(
        cls,
        *,
        rows: np.ndarray,
        scores: np.ndarray,
        indices: np.ndarray,
        filtered: FilteredCandidates,
        inside: np.ndarray,
        false_negatives: np.ndarray,
        plan: BatchPlan,
    ) -> CandidateTotals:
        """One partition's totals.

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
        return cls(
            top1_sum=float(top1.sum()),
            top1_count=len(top1),
            candidates=int((indices >= 0).sum()),
            kept=int(filtered.allowed.sum()),
            flagged=int((filtered.false_negative & (indices != rows[:, None])).sum()),
            pairs_in_batches=false_negative_pairs(plan, false_negatives),
            outside=int((filtered.allowed & ~inside).sum()),
            partitions=1,
            removed={name: int(count.sum()) for name, count in filtered.removed.items()},
        )

    def add(self, other: CandidateTotals) -> None:
        """Another partition's totals, added to these."""
        for name in (f.name for f in fields(self) if f.name != "removed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, count in other.removed.items():
            self.removed[name] = self.removed.get(name, 0) + count

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


class PlanQuality:
    """What a corpus refresh logs of its plan, measured partition after partition as each one's
    batches are written, so that no step holds the whole plan: the churn against the last
    plan's batches (each row's batch kept by the row's holder, not here), and the in-batch
    similarities of a seeded sample of the batches, drawn from the plan in its final order
    (``order``) as if it were whole.

    Args:
        texts: the corpus the plan orders, under the weights it was planned with (the vectors
            of the sampled batches' rows are fetched from it).
        num_batches: the plan's batches.
        order: ``(num_batches,)`` the batches' final order, as positions in the order they are
            added (:meth:`~pipeline.batching.plan.BatchPlan.reordered`'s permutation).
        version: the refresh's: each row's batch is kept under it where the row is held
            (:meth:`~pipeline.mining.encoded_texts.EncodedTexts.record_batches`).
        previous: the last refresh's version, whose batches the churn is measured against;
            None: the first refresh (or a restarted miner's).
        seed: seeds the samples.
        max_batches: most batches whose pairs are sampled.
    """

    def __init__(
        self,
        texts: EncodedTexts,
        *,
        num_batches: int,
        order: np.ndarray,
        version: int,
        previous: int | None,
        seed: int,
        max_batches: int = 2000,
    ):
        self.texts, self.version, self.previous, self.seed = texts, version, previous, seed
        picked = np.arange(num_batches)
        if num_batches > max_batches:
            picked = np.random.default_rng(seed).choice(num_batches, size=max_batches, replace=False)
        self._slot_of = {int(order[p]): slot for slot, p in enumerate(picked)}
        self._sampled: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(picked)
        self._added = self._kept_pairs = self._pairs = 0
        self._churn_known = previous is not None

    def add(self, plan: BatchPlan) -> None:
        """The next batches of the plan (a partition's, in corpus positions)."""
        first = self._added
        self._added += plan.num_batches
        numbers = np.repeat(np.arange(first, self._added, dtype=np.int32), plan.sizes)
        earlier = self.texts.record_batches(plan.rows, numbers, version=self.version, previous=self.previous)
        # A holder replaced since the last refresh (its node lost) no longer knows its rows' batches.
        self._churn_known &= bool((earlier >= 0).all())
        if self._churn_known:
            kept, pairs = together_again(earlier, plan)
            self._kept_pairs, self._pairs = self._kept_pairs + kept, self._pairs + pairs
        starts = np.cumsum(plan.sizes) - plan.sizes
        for number in range(first, self._added):
            slot = self._slot_of.get(number)
            if slot is not None:
                start = starts[number - first]
                self._sampled[slot] = plan.rows[start : start + plan.sizes[number - first]]

    def metrics(self) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """``mining/`` metrics of every batch added, and ``{"random pairs": ..., "mined plan":
        ...}`` cosine similarities."""
        metrics = {}
        if self._churn_known:
            metrics["mining/churn"] = 1.0 - self._kept_pairs / max(self._pairs, 1)
        in_batch = in_batch_pair_similarities(self.texts, self._sampled)
        # Random pairs of rows are what random batches hold: the baseline the plan is read against.
        n = self.texts.rows
        sample, partners = random_pairs(n, n, self.seed)
        random_similarities = np.einsum("ij,ij->i", self.texts.vectors(sample), self.texts.vectors(partners))
        metrics |= {f"mining/batch_similarity_{k}": v for k, v in similarity_percentiles(in_batch).items()}
        metrics["mining/random_batch_similarity_mean"] = float(random_similarities.mean())
        return metrics, {"random pairs": random_similarities, "mined plan": in_batch}


def in_batch_pair_similarities(texts: EncodedTexts, batches: list[np.ndarray]) -> np.ndarray:
    """Cosine similarity of every distinct pair inside each of ``batches`` (rows' corpus
    positions): the similarity of the negatives the loss sees."""
    if not batches:
        return np.empty(0, dtype=np.float32)
    # One fetch for every sampled row: the rows may sit in the miner's shards.
    vectors = np.split(texts.vectors(np.concatenate(batches)), np.cumsum([len(b) for b in batches])[:-1])
    parts = []
    for e in vectors:
        upper = np.triu_indices(len(e), k=1)
        parts.append((e @ e.T)[upper])
    return np.concatenate(parts)


def batch_of_rows(plan: BatchPlan) -> np.ndarray:
    """``(rows,)`` each row's batch in ``plan`` (``plan.rows`` a permutation of its positions)."""
    batch_of = np.empty(len(plan.rows), dtype=np.int64)
    batch_of[plan.rows] = np.repeat(np.arange(plan.num_batches), plan.sizes)
    return batch_of


def false_negative_pairs(plan: BatchPlan, false_negatives: np.ndarray) -> int:
    """How many (row, flagged false negative) pairs ended up in the same batch."""
    batch_of = batch_of_rows(plan)
    valid = false_negatives >= 0
    rows = np.broadcast_to(np.arange(len(false_negatives))[:, None], false_negatives.shape)[valid]
    return int((batch_of[rows] == batch_of[false_negatives[valid]]).sum())


def together_again(earlier: np.ndarray, plan: BatchPlan) -> tuple[int, int]:
    """Of the ordered in-batch pairs of ``plan``'s batches, how many shared a batch before
    (``earlier``: ``(len(plan.rows),)`` the batch of each of ``plan.rows`` in the earlier plan),
    and how many there are."""
    batch = np.repeat(np.arange(plan.num_batches), plan.sizes)
    earlier = np.asarray(earlier, dtype=np.int64)
    # Rows of one batch that were together before share (batch, earlier batch).
    _, counts = np.unique(batch * (int(earlier.max(initial=0)) + 1) + earlier, return_counts=True)
    sizes = np.asarray(plan.sizes, dtype=np.int64)
    return int((counts * (counts - 1)).sum()), int((sizes * (sizes - 1)).sum())


def _first_valid_scores(scores: np.ndarray, cleaned: np.ndarray) -> np.ndarray:
    valid = cleaned >= 0
    has = valid.any(axis=1)
    first = valid.argmax(axis=1)
    return scores[np.arange(len(scores)), first][has]
