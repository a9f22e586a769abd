"""Neighbourhood mode's refresh: from the k-NN lists to the next epoch's plan.

The miner filters every row's neighbours (duplicates and likely false negatives out), groups
the rows into batches with the sampler ``mining.batch_sampler`` names, and attaches what the
workers need to debias the loss (``mining.debias``): each row's likely paraphrases, or each
row's k-means cluster. One place decides all of it, so a new sampler is one branch here plus
its function in ``pipeline/batching``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.batching.plan import BatchPlan
from pipeline.batching.registry import SAMPLERS, build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.mining.clustering import kmeans_clusters
from pipeline.mining.negatives import FilteredCandidates, NegativeFilters, filter_candidates
from pipeline.mining.text_keys import duplicate_mask

if TYPE_CHECKING:
    from pipeline.config.mining_section import MiningSection


@dataclass(frozen=True)
class PlanSettings:
    """How the miner groups a refreshed epoch and what it ships for debiasing (the
    ``mining`` keys of the same names)."""

    batch_sampler: str = "random"
    restart_probability: float = 0.2
    num_clusters: int | None = None
    clusters_per_batch: int = 4
    mixed_share: float = 0.5
    mixed_group_size: int = 4
    debias: str = "none"
    debias_threshold: float = 0.8

    @classmethod
    def from_mining(cls, mining: MiningSection) -> PlanSettings:
        return cls(
            batch_sampler=mining.batch_sampler,
            restart_probability=mining.restart_probability,
            num_clusters=mining.num_clusters,
            clusters_per_batch=mining.clusters_per_batch,
            mixed_share=mining.mixed_share,
            mixed_group_size=mining.mixed_group_size,
            debias=mining.debias,
            debias_threshold=mining.debias_threshold,
        )

    @property
    def needs_clusters(self) -> bool:
        return SAMPLERS[self.batch_sampler].needs_clusters or self.debias == "cluster"

    def cluster_count(self, num_rows: int, batch_size: int) -> int:
        """``num_clusters``, or one cluster per batch's worth of rows (at least 2)."""
        wanted = self.num_clusters if self.num_clusters is not None else num_rows // batch_size
        return max(2, min(wanted, num_rows // 2))


@dataclass
class RefreshedPlan:
    """What :func:`plan_from_neighbours` returns."""

    plan: BatchPlan
    """The next epoch's plan, with its sampler and debiasing hints recorded."""
    filtered: FilteredCandidates
    """Each k-NN candidate's fate under the negative filters."""
    false_negatives: np.ndarray
    """``(n, k)`` each row's flagged false negatives (kept out of its batch), -1 elsewhere."""


def plan_from_neighbours(
    knn: Any,
    embeddings: np.ndarray,
    text_keys: np.ndarray,
    filters: NegativeFilters,
    settings: PlanSettings,
    batch_size: int,
    seed: int,
    version: int,
    use_gpu: bool = False,
) -> RefreshedPlan:
    """Filter every row's k-NN candidates, plan the epoch's batches, attach debiasing hints.

    Each row is its own positive (unsupervised), so the relative margin is against 1.0.

    Args:
        knn: the corpus searched against itself (``indices``/``scores``, ``(n, k)``, nearest first).
        embeddings: ``(n, d)`` the normalised embeddings searched (k-means runs on them).
        text_keys: ``(n,)`` :func:`~pipeline.mining.text_keys.text_keys` of the rows.
        filters: what makes a neighbour an acceptable negative.
        settings: the sampler and debiasing rule.
        batch_size: global batch size.
        seed: makes the plan deterministic.
        version: the plan version to record.
        use_gpu: run k-means on the GPU (when FAISS has one).
    """
    n = len(knn.indices)
    duplicate = duplicate_mask(knn.indices, text_keys, text_keys, text_keys)
    filtered = filter_candidates(knn.indices, knn.scores, np.ones(n, dtype=np.float32), duplicate, filters)
    neighbours = np.where(filtered.allowed, knn.indices, -1)
    itself = knn.indices == np.arange(n)[:, None]
    false_negatives = np.where(filtered.false_negative & ~itself, knn.indices, -1)
    clusters = None
    if settings.needs_clusters:
        clusters = kmeans_clusters(embeddings, settings.cluster_count(n, batch_size), seed, use_gpu=use_gpu)
    inputs = SamplerInputs(
        neighbours, knn.scores, false_negatives, batch_size, seed, version, clusters=clusters,
        restart_probability=settings.restart_probability, clusters_per_batch=settings.clusters_per_batch,
        mixed_share=settings.mixed_share, mixed_group_size=settings.mixed_group_size,
    )  # fmt: skip
    plan = build_plan(settings.batch_sampler, inputs)
    if settings.debias == "threshold":
        plan.paraphrases = likely_paraphrases(knn.indices, knn.scores, settings.debias_threshold)
    elif settings.debias == "cluster":
        plan.clusters = clusters
    return RefreshedPlan(plan, filtered, false_negatives)


def likely_paraphrases(indices: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Each row's k-NN neighbours more similar than ``threshold``: the in-batch candidates the
    loss treats as likely false negatives under ``mining.debias: threshold``.

    Args:
        indices: ``(n, k)`` neighbours, nearest first, -1 for an empty slot.
        scores: ``(n, k)`` their similarities.
        threshold: cosine similarity under the refresh model.

    Returns:
        ``(n, m)`` int64, -1 padded, ``m`` the most any row has (at least 1): only as wide as
        needed, since the plan travels to every worker with it.
    """
    n = len(indices)
    flagged = (scores > threshold) & (indices >= 0) & (indices != np.arange(n)[:, None])
    width = max(1, int(flagged.sum(axis=1).max(initial=0)))
    # Flagged entries first (stable: nearest first), then cut to the widest row.
    order = np.argsort(~flagged, axis=1, kind="stable")[:, :width]
    kept = np.take_along_axis(flagged, order, axis=1)
    return np.where(kept, np.take_along_axis(indices, order, axis=1), -1).astype(np.int64)
