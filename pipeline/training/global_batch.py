"""What a train step is given: :class:`GlobalBatch`, one step's rows of the global batch and
which slice of them is this worker's, with the rows' mined negatives (pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.batching.plan import BatchPlan, worker_slices
from pipeline.data.triplets import Triplets


@dataclass(frozen=True)
class GlobalBatch:
    """One step's rows: the whole global batch, and which slice of it is this worker's."""

    rows: np.ndarray
    """``(sum(sizes),)`` training-row positions of the global batch, rank 0's rows first (a
    slice of the epoch's plan)."""
    sizes: Sequence[int]
    """Rows held by each rank (:func:`pipeline.batching.plan.worker_slices`)."""
    rank: int
    """This worker's rank: it trains on slice ``rank`` of ``rows``."""
    mined: np.ndarray | None = None
    """Pairs task: the rows' ``(num_rows, num_negatives)`` mined-negatives column (-1 where
    none), or None before the first mining; unused otherwise."""

    @classmethod
    def of_plan(
        cls,
        plan: BatchPlan,
        batch_index: int,
        *,
        world: int,
        rank: int,
        negatives: np.ndarray | None = None,
    ) -> GlobalBatch:
        """Batch ``batch_index`` of ``plan`` as rank ``rank`` of ``world`` trains it, with the
        rows' ``negatives`` column."""
        rows = plan.batch(batch_index)
        return cls(rows, worker_slices(len(rows), world), rank, negatives)

    @property
    def local_rows(self) -> np.ndarray:
        """This worker's contiguous slice of :attr:`rows` (``sizes[rank]`` rows)."""
        lo = sum(self.sizes[: self.rank])
        return self.rows[lo : lo + self.sizes[self.rank]]


def rows_of_rank(plan: BatchPlan, *, world: int, rank: int) -> np.ndarray:
    """Every row rank ``rank`` of ``world`` trains on in ``plan``'s epoch, batch after batch:
    its slice (:func:`~pipeline.batching.plan.worker_slices`) of each global batch, as
    :meth:`GlobalBatch.local_rows` gives them one step at a time."""
    sizes = np.asarray(plan.sizes, dtype=np.int64)
    base, extra = np.divmod(sizes, world)
    first = np.cumsum(sizes) - sizes + base * rank + np.minimum(rank, extra)
    count = base + (rank < extra)
    # Row i of the rank's share is the (i - its batch's offset)-th row after its batch's first.
    offset = np.cumsum(count) - count
    within = np.arange(int(count.sum())) - np.repeat(offset, count)
    return plan.rows[np.repeat(first, count) + within]


def texts_of_rank(
    plan: BatchPlan,
    *,
    world: int,
    rank: int,
    triplets: Triplets | None = None,
    negatives: np.ndarray | None = None,
) -> np.ndarray:
    """Corpus positions of every text rank ``rank`` encodes in ``plan``'s epoch (repeats
    included): its rows' sentences, or for triplet rows their anchors, positives, given
    negatives and mined ``negatives`` (the rows' column, -1 where none)."""
    rows = rows_of_rank(plan, world=world, rank=rank)
    if triplets is None:
        return rows
    parts = [triplets.anchor[rows], triplets.positive[rows], triplets.negative[rows]]
    if negatives is not None:
        parts.append(np.asarray(negatives)[rows].reshape(-1))
    texts = np.concatenate(parts)
    return texts[texts >= 0]
