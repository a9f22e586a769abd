"""Batch plans: which corpus rows form each global batch of an epoch.

A plan covers every corpus row exactly once. Batch sizes are balanced (they differ by at
most one), so every epoch has the same number of optimizer steps whatever the plan, and
with ``batch_size >= 2 x num_workers`` every worker gets rows in every batch.

A plan is the order of the rows, nothing else a row carries: the pairs task's mined negatives
are a column of the training rows (each rank's :attr:`PlanShare.negatives`), not part of the plan.

Epoch 1 uses :func:`~pipeline.batching.samplers.random_plan` (optionally grouped by length);
after each refresh of a corpus the miner plans the next epoch with the sampler
``mining.batch_sampler`` names (``pipeline/batching/samplers.py``).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace

import numpy as np


@dataclass
class BatchPlan:
    version: int
    """0 for the random first epoch, then 1, 2, ... per refresh."""
    rows: np.ndarray
    """``(n,)`` corpus positions, batch after batch: int32 up to 2^31 rows
    (:func:`~pipeline.core.positions.position_dtype`), int64 above."""
    sizes: np.ndarray
    """``(num_batches,)`` int64 rows per batch."""
    sampler: str = "random"
    """The sampler that grouped the rows (``mining.batch_sampler``; ``random`` for epoch 1)."""

    @property
    def num_batches(self) -> int:
        return len(self.sizes)

    def batch(self, index: int) -> np.ndarray:
        start = int(self.sizes[:index].sum())
        return self.rows[start : start + int(self.sizes[index])]

    def batches(self) -> list[np.ndarray]:
        return np.split(self.rows, np.cumsum(self.sizes)[:-1])

    def reordered(self, seed: int) -> BatchPlan:
        """The same batches in a seeded random order (same version)."""
        batches = self.batches()
        order = np.random.default_rng(seed).permutation(len(batches))
        return replace(self, rows=np.concatenate([batches[i] for i in order]), sizes=self.sizes[order])

    def fingerprint(self, negatives: np.ndarray | None = None) -> int:
        """A 48-bit hash of the plan and the rows' ``negatives`` column: two runs, or a run and
        its resumption, trained on the same batches exactly when their fingerprints match."""

        digest = hashlib.blake2b(digest_size=6)
        digest.update(str(self.version).encode())
        for part in (self.rows, self.sizes, negatives):
            if part is not None:
                digest.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
        return int.from_bytes(digest.digest(), "little")

    def hex_fingerprint(self, negatives: np.ndarray | None = None) -> str:
        """:meth:`fingerprint` as 12 hex digits, as the run's ``plan.fingerprint.epoch_N`` tags hold it."""
        return f"{self.fingerprint(negatives):012x}"

    def share(
        self,
        *,
        world: int,
        rank: int,
        negatives: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
    ) -> PlanShare:
        """Rank ``rank`` of ``world``'s part of this plan (:class:`PlanShare`): its slice of each
        batch (:func:`worker_slices`), with the rows' ``negatives`` beside them, the whole plan's
        fingerprint and (given ``lengths``, as :func:`padding_share` takes them) its padding share."""
        (share,) = self.shares(world=world, ranks=[rank], negatives=negatives, lengths=lengths)
        return share

    def shares(
        self,
        *,
        world: int,
        ranks: list[int] | None = None,
        negatives: np.ndarray | None = None,
        teacher_scores: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
    ) -> list[PlanShare]:
        """:meth:`share` of each of ``ranks`` (None: every rank), the whole plan's fingerprint
        and padding share computed once for all; the teacher's scores of the negatives, if any,
        go beside them."""
        fingerprint = self.hex_fingerprint(negatives)
        padding = padding_share(self, lengths, world) if lengths is not None else 0.0
        return [
            replace(
                self._cut(world, rank, negatives, teacher_scores), fingerprint=fingerprint, padding=padding
            )
            for rank in (range(world) if ranks is None else ranks)
        ]

    def _cut(
        self, world: int, rank: int, negatives: np.ndarray | None, teacher_scores: np.ndarray | None = None
    ) -> PlanShare:
        sizes = np.asarray(self.sizes, dtype=np.int64)
        count = rank_counts(sizes, world, rank)
        base, extra = np.divmod(sizes, world)
        first = np.cumsum(sizes) - sizes + base * rank + np.minimum(rank, extra)
        # Row i of the share is the (i - its batch's offset)-th row after its batch's first.
        offset = np.cumsum(count) - count
        rows = self.rows[np.repeat(first, count) + np.arange(int(count.sum())) - np.repeat(offset, count)]
        return PlanShare(
            version=self.version,
            sizes=sizes,
            world=world,
            rank=rank,
            rows=rows,
            negatives=np.asarray(negatives)[rows] if negatives is not None else None,
            teacher_scores=np.asarray(teacher_scores)[rows] if teacher_scores is not None else None,
            sampler=self.sampler,
        )


@dataclass
class PlanShare:
    """One rank's part of an epoch's :class:`BatchPlan`: the rows it trains on, batch after
    batch, with their mined negatives beside them (pairs), and what it needs to know of the
    whole plan: the global batch sizes, the fingerprint and the padding share. A rank never
    holds the whole plan; :meth:`BatchPlan.share` cuts this out of it where it is made."""

    version: int
    sizes: np.ndarray
    """``(num_batches,)`` rows of each global batch."""
    world: int
    rank: int
    rows: np.ndarray
    """This rank's rows: its slice (:func:`worker_slices`) of batch 0, then of batch 1, ..."""
    negatives: np.ndarray | None = None
    """``(len(rows), m)`` the rows' mined negatives (-1: none), beside them; None: none mined."""
    teacher_scores: np.ndarray | None = None
    """``(len(rows), 1 + m)`` the teacher's scores of the rows' positives and negatives (NaN:
    none), beside them; None: no teacher."""
    sampler: str = "random"
    fingerprint: str = ""
    """The whole plan's :meth:`BatchPlan.hex_fingerprint` with the whole negatives column."""
    padding: float = 0.0
    """The whole plan's :func:`padding_share` at ``world`` workers."""
    texts: np.ndarray | None = None
    """Sorted, distinct positions of every text the rows encode (for pairs: anchors, positives
    and negatives), what the rank fetches for the epoch; None: the rows themselves."""
    text_lengths: np.ndarray | None = None
    """Tokens of each of :attr:`texts` (or of the rows, sorted)."""

    @property
    def num_batches(self) -> int:
        return len(self.sizes)

    @functools.cached_property
    def _bounds(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(rank_counts(self.sizes, self.world, self.rank))])

    def _batch(self, index: int) -> slice:
        """This rank's rows of batch ``index``, as a slice of :attr:`rows` and the columns beside it."""
        return slice(self._bounds[index], self._bounds[index + 1])

    def local(self, index: int) -> tuple[np.ndarray, np.ndarray | None]:
        """This rank's rows of batch ``index`` and their negatives (None: none mined)."""
        at = self._batch(index)
        return self.rows[at], self.negatives[at] if self.negatives is not None else None

    def local_teacher_scores(self, index: int) -> np.ndarray | None:
        """The teacher's scores of this rank's rows of batch ``index`` (None: no teacher)."""
        return self.teacher_scores[self._batch(index)] if self.teacher_scores is not None else None


def balanced_batch_sizes(num_rows: int, batch_size: int) -> np.ndarray:
    """``ceil(n / batch_size)`` batch sizes that sum to n and differ by at most one."""
    if num_rows < batch_size:
        raise ValueError(f"train.batch_size ({batch_size}) is larger than the corpus ({num_rows} sentences)")
    num_batches = -(-num_rows // batch_size)
    sizes = np.full(num_batches, num_rows // num_batches, dtype=np.int64)
    sizes[: num_rows % num_batches] += 1
    return sizes


def worker_slices(batch_len: int, world_size: int) -> list[int]:
    """Rows of one global batch held by each rank (contiguous, rank 0 first)."""
    base, extra = divmod(batch_len, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def rank_counts(sizes: np.ndarray, world: int, rank: int) -> np.ndarray:
    """Rows rank ``rank`` holds of each global batch of ``sizes`` (:func:`worker_slices`, vectorised)."""
    base, extra = np.divmod(np.asarray(sizes, dtype=np.int64), world)
    return base + (rank < extra)


def padding_share(plan: BatchPlan, lengths: np.ndarray, world_size: int = 1) -> float:
    """Share of pad tokens in an epoch on this plan: each worker pads its slice of every
    global batch (:func:`worker_slices`) to the slice's longest row, each column on its own.

    Args:
        plan: the epoch's plan.
        lengths: ``(num_rows,)`` tokens per row, or ``(num_rows, k)`` for rows of k texts
            that the step pads apart (the pairs step's anchors and positives:
            :func:`pipeline.data.tokenized.padded_lengths`).
        world_size: DDP workers.

    Returns:
        ``1 - real tokens / padded tokens``, in [0, 1).
    """
    widths = np.asarray(lengths).reshape(len(lengths), -1)[plan.rows].astype(np.int64)
    # The plan's rows are batch after batch, each batch rank 0's slice first: every worker's
    # slice is one run of consecutive rows.
    counts = np.stack([rank_counts(plan.sizes, world_size, r) for r in range(world_size)], axis=1).reshape(-1)
    counts = counts[counts > 0]
    if not len(counts):
        return 0.0
    starts = np.cumsum(counts) - counts
    padded = int((np.maximum.reduceat(widths, starts, axis=0).sum(axis=1) * counts).sum())
    return 1.0 - int(widths.sum()) / padded if padded else 0.0
