"""What a batch sampler draws on for one refresh: one argument for every sampler, so that the
registry (:mod:`pipeline.batching.registry`) calls each the same way and a new sampler adds a
field, not a parameter to every signature."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.batching.plan import balanced_batch_sizes


@dataclass(frozen=True)
class SamplerInputs:
    """What any sampler may draw on for one refresh (each uses what it needs)."""

    neighbours: np.ndarray
    """``(n, k)`` each row's nearest neighbours after the filters, -1 padded."""
    scores: np.ndarray
    """``(n, k)`` their cosine similarities."""
    false_negatives: np.ndarray | None
    """``(n, k)`` each row's flagged likely false negatives (kept out of its batch), -1
    elsewhere; None: none flagged."""
    batch_size: int
    seed: int
    version: int
    sizes: np.ndarray | None = None
    """The batch sizes to cut the rows into (summing to ``n``): a partition's share of the
    epoch's batches (:mod:`pipeline.mining.corpus_partitions`); None: the balanced sizes of ``n``
    rows at ``batch_size``."""

    def batch_sizes(self) -> np.ndarray:
        """:attr:`sizes`, or :func:`~pipeline.batching.plan.balanced_batch_sizes` of the rows."""
        num_rows = len(self.neighbours)
        if self.sizes is None:
            return balanced_batch_sizes(num_rows, self.batch_size)
        if int(np.sum(self.sizes)) != num_rows:
            raise ValueError(f"batch sizes sum to {int(np.sum(self.sizes))}, not the {num_rows} rows to plan")
        return np.asarray(self.sizes, dtype=np.int64)
