"""What a batch sampler draws on for one refresh: one argument for every sampler, so that the
registry (:mod:`pipeline.batching.registry`) calls each the same way and a new sampler adds a
field, not a parameter to every signature."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
