"""Neighbourhood mode's refresh: from the k-NN lists to the next epoch's plan.

The miner filters every row's neighbours (duplicates and likely false negatives out) and groups
the rows into batches with the sampler ``mining.batch_sampler`` names, each row's flagged false
negatives kept out of its batch. One place decides it, so a new sampler is one entry in
:mod:`pipeline.batching.registry` plus its function in ``pipeline/batching``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.batching.plan import BatchPlan
from pipeline.batching.registry import build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.mining.negatives import FilteredCandidates, NegativeFilters, filter_candidates
from pipeline.mining.text_keys import duplicate_mask

if TYPE_CHECKING:
    from pipeline.config.mining_section import MiningSection


@dataclass(frozen=True)
class PlanSettings:
    """How the miner groups a refreshed epoch (the ``mining`` key of the same name)."""

    batch_sampler: str = "random"

    @classmethod
    def from_mining(cls, mining: MiningSection) -> PlanSettings:
        return cls(batch_sampler=mining.batch_sampler)


@dataclass
class RefreshedPlan:
    """What :func:`plan_from_neighbours` returns."""

    plan: BatchPlan
    """The next epoch's plan, with its sampler recorded."""
    filtered: FilteredCandidates
    """Each k-NN candidate's fate under the negative filters."""
    false_negatives: np.ndarray
    """``(n, k)`` each row's flagged false negatives (kept out of its batch), -1 elsewhere."""


def plan_from_neighbours(
    knn: Any,
    text_keys: np.ndarray,
    filters: NegativeFilters,
    settings: PlanSettings,
    batch_size: int,
    seed: int,
    version: int,
) -> RefreshedPlan:
    """Filter every row's k-NN candidates and plan the epoch's batches.

    Each row is its own positive (unsupervised), so the relative margin is against 1.0.

    Args:
        knn: the corpus searched against itself (``indices``/``scores``, ``(n, k)``, nearest first).
        text_keys: ``(n,)`` :func:`~pipeline.mining.text_keys.text_keys` of the rows.
        filters: what makes a neighbour an acceptable negative.
        settings: the sampler.
        batch_size: global batch size.
        seed: makes the plan deterministic.
        version: the plan version to record.
    """
    n = len(knn.indices)
    duplicate = duplicate_mask(knn.indices, text_keys, text_keys, text_keys)
    filtered = filter_candidates(knn.indices, knn.scores, np.ones(n, dtype=np.float32), duplicate, filters)
    neighbours = np.where(filtered.allowed, knn.indices, -1)
    itself = knn.indices == np.arange(n)[:, None]
    false_negatives = np.where(filtered.false_negative & ~itself, knn.indices, -1)
    inputs = SamplerInputs(neighbours, knn.scores, false_negatives, batch_size, seed, version)
    plan = build_plan(settings.batch_sampler, inputs)
    return RefreshedPlan(plan, filtered, false_negatives)
