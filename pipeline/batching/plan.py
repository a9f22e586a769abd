"""Batch plans: which corpus rows form each global batch of an epoch.

A plan covers every corpus row exactly once. Batch sizes are balanced (they differ by at
most one), so every epoch has the same number of optimizer steps whatever the plan, and
with ``batch_size >= 2 x num_workers`` every worker gets rows in every batch.

A plan is the order of the rows, nothing else a row carries: the pairs task's mined negatives
are a column of the training rows (``TrainState.negatives``), not part of the plan.

Epoch 1 uses :func:`~pipeline.batching.samplers.random_plan` (optionally grouped by length);
after each refresh of a corpus the miner plans the next epoch with the sampler
``mining.batch_sampler`` names (``pipeline/batching/samplers.py``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np


@dataclass
class BatchPlan:
    version: int
    """0 for the random first epoch, then 1, 2, ... per refresh."""
    rows: np.ndarray
    """``(n,)`` int64 corpus positions, batch after batch."""
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

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "rows": self.rows,
            "sizes": self.sizes,
            "sampler": self.sampler,
        }

    @classmethod
    def from_dict(cls, data: dict) -> BatchPlan:
        return cls(
            int(data["version"]),
            np.asarray(data["rows"], dtype=np.int64),
            np.asarray(data["sizes"], dtype=np.int64),
            str(data.get("sampler", "random")),
        )


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
    columns = lengths.reshape(len(lengths), -1)
    real = padded = 0
    for batch in plan.batches():
        start = 0
        for size in worker_slices(len(batch), world_size):
            widths = columns[batch[start : start + size]]
            start += size
            if size:
                real += int(widths.sum())
                padded += size * int(widths.max(axis=0).sum())
    return 1.0 - real / padded if padded else 0.0
