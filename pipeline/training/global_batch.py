"""What a train step is given: :class:`GlobalBatch`, one step's rows of the global batch and
which slice of them is this worker's, with the rows' mined negatives (pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from pipeline.batching.plan import BatchPlan, PlanShare, worker_slices


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
    """Pairs task: ``(sum(sizes), num_negatives)`` the mined negatives of :attr:`rows`, row by
    row (-1 where none), or None before the first mining; unused otherwise."""
    local_teacher_scores: np.ndarray | None = None
    """Pairs task with a teacher: ``(sizes[rank], 1 + num_negatives)`` its scores of this
    worker's rows' positives and mined negatives (NaN where none); a rank's distillation term
    reads its own rows only, so they are not gathered."""

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
        return cls(
            rows, worker_slices(len(rows), world), rank, negatives[rows] if negatives is not None else None
        )

    @classmethod
    def of_share(cls, share: PlanShare, batch_index: int, device: torch.device) -> GlobalBatch:
        """Batch ``batch_index`` as this rank trains it, from its :class:`PlanShare`: its own
        rows and their negatives, and every other rank's, all-gathered (a few integers a row:
        no rank holds the whole plan)."""
        rows, negatives = share.local(batch_index)
        sizes = worker_slices(int(share.sizes[batch_index]), share.world)
        teacher = share.local_teacher_scores(batch_index)
        # Copies: the share's arrays are read-only views of the object store, which torch
        # warns about when a step turns them into tensors.
        teacher = teacher.copy() if teacher is not None else None
        if share.world == 1:
            return cls(
                rows.copy(), sizes, share.rank, negatives.copy() if negatives is not None else None, teacher
            )
        local = rows[:, None] if negatives is None else np.concatenate([rows[:, None], negatives], axis=1)
        every = gather_rows(local, sizes, device)
        return cls(
            every[:, 0].copy(), sizes, share.rank, every[:, 1:] if negatives is not None else None, teacher
        )

    @property
    def local_rows(self) -> np.ndarray:
        """This worker's contiguous slice of :attr:`rows` (``sizes[rank]`` rows)."""
        lo = sum(self.sizes[: self.rank])
        return self.rows[lo : lo + self.sizes[self.rank]]

    @property
    def local_mined(self) -> np.ndarray | None:
        """The mined negatives of :attr:`local_rows` (None: none mined)."""
        if self.mined is None:
            return None
        lo = sum(self.sizes[: self.rank])
        return self.mined[lo : lo + self.sizes[self.rank]]


def gather_rows(local: np.ndarray, sizes: list[int], device: torch.device) -> np.ndarray:
    """Every rank's ``(sizes[r], c)`` int64 ``local`` rows, rank order, on every rank (padded
    to the largest slice for the all-gather, on ``device`` as the process group needs)."""
    width = max(sizes)
    padded = torch.full((width, local.shape[1]), -1, dtype=torch.int64, device=device)
    # A copy: the share's arrays are read-only views of the object store.
    padded[: len(local)] = torch.tensor(np.asarray(local, dtype=np.int64), device=device)
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return np.concatenate([part[:size].cpu().numpy() for part, size in zip(gathered, sizes, strict=True)])
