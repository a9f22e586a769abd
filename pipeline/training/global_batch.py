"""What a train step is given: :class:`GlobalBatch`, one step's rows of the global batch and
which slice of them is this worker's, with the rows' mined negatives (pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.batching.plan import BatchPlan, worker_slices


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
