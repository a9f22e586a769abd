"""What a train step is given: :class:`GlobalBatch`, one step's rows of the global batch and
which slice of them is this worker's, with the rows' mined negatives (pairs) or the plan's
false-negative mask (corpus)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.batching.plan import BatchPlan, worker_slices
from pipeline.training.debias import false_negative_mask


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
    false_negative_mask: np.ndarray | None = None
    """Unsupervised mode with ``mining.debias``: ``(sum(sizes), sum(sizes))`` bool over
    :attr:`rows`, True at (i, j) when row j is a likely false negative of row i
    (:func:`pipeline.training.debias.false_negative_mask`, the same on every rank); None: no
    debiasing. The pairs task ignores it."""

    @classmethod
    def of_plan(
        cls,
        plan: BatchPlan,
        batch_index: int,
        *,
        world: int,
        rank: int,
        debias: str,
        negatives: np.ndarray | None = None,
    ) -> GlobalBatch:
        """Batch ``batch_index`` of ``plan`` as rank ``rank`` of ``world`` trains it, with the
        rows' ``negatives`` column. Every rank holds the same plan, so every rank builds the same
        mask of the global batch (None on epoch 1's random plan, or without ``mining.debias``)."""
        rows = plan.batch(batch_index)
        mask = false_negative_mask(rows, plan, debias)
        return cls(rows, worker_slices(len(rows), world), rank, negatives, mask)

    @property
    def local_rows(self) -> np.ndarray:
        """This worker's contiguous slice of :attr:`rows` (``sizes[rank]`` rows)."""
        lo = sum(self.sizes[: self.rank])
        return self.rows[lo : lo + self.sizes[self.rank]]
