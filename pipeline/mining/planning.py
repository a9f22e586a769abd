"""Neighbourhood mode's refresh: from the k-NN lists to the next epoch's plan.

The miner filters every row's neighbours (duplicates and likely false negatives out) and groups
the rows into batches with the sampler ``mining.batch_sampler`` names, each row's flagged false
negatives kept out of its batch. One place decides it, so a new sampler is one entry in
:mod:`pipeline.batching.registry` plus its function in ``pipeline/batching``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.batching.plan import BatchPlan
from pipeline.batching.registry import build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import random_plan
from pipeline.mining.index import estimate_index_bytes, knn_search
from pipeline.mining.mining_metrics import similarity_percentiles
from pipeline.mining.negatives import FilteredCandidates, NegativeFilters, filter_candidates
from pipeline.mining.plan_quality import (
    _first_valid_scores,
    false_negative_pairs,
    in_batch_pair_similarities,
    plan_churn,
)
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import duplicate_mask

if TYPE_CHECKING:
    from pipeline.config.mining_section import MiningSection
    from pipeline.mining.miner_settings import MinerSettings


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


def refresh_corpus(
    embeddings: np.ndarray,
    *,
    keys: np.ndarray,
    settings: MinerSettings,
    version: int,
    previous: RefreshReport | None,
) -> RefreshReport:
    """The corpus task's refresh, after the encode: search the corpus against itself, filter
    each row's neighbours, plan the next epoch's batches, describe the plan.

    Args:
        embeddings: ``(rows, dim)`` the corpus under the newest weights.
        keys: ``(rows,)`` :func:`~pipeline.mining.text_keys.text_keys` of the rows.
        settings: search, filters, sampler, batch size and seed.
        version: this refresh's version (it seeds the search and the plan).
        previous: the last refresh's report, for the churn.

    Returns:
        The report with ``plan``: the next order of rows.
    """
    s = settings
    n = len(embeddings)
    k = min(s.search.top_k + 1, n)
    kind = s.search.index_kind(n)
    estimate = estimate_index_bytes(n, embeddings.shape[1], k, kind)
    print(
        f"[mining] v{version}: {kind} index over {n} x {embeddings.shape[1]}, about {estimate / 2**20:.0f} MiB",
        flush=True,
    )
    knn = knn_search(embeddings, k, use_gpu=s.use_gpu, spec=s.search.index, seed=s.seed + version)
    started = time.perf_counter()
    refreshed = plan_from_neighbours(knn, keys, s.filters, s.plan, s.batch_size, s.seed + version, version)
    plan, filtered, false_negatives = refreshed.plan, refreshed.filtered, refreshed.false_negatives
    plan_seconds = time.perf_counter() - started
    top1 = _first_valid_scores(knn.scores, np.where(filtered.duplicate, -1, knn.indices))
    baseline = random_plan(n, s.batch_size, seed=s.seed + 10_000 + version)
    pair_sims = in_batch_pair_similarities(embeddings, plan, s.seed)
    random_sims = in_batch_pair_similarities(embeddings, baseline, s.seed)
    metrics = {
        "mining/index_s": knn.index_seconds,
        "mining/search_s": knn.search_seconds,
        "mining/plan_s": plan_seconds,
        "mining/corpus_size": float(n),
        "mining/index_estimated_mib": estimate / 2**20,
        "mining/top1_similarity_mean": float(top1.mean()) if len(top1) else float("nan"),
        "mining/candidates": float(filtered.candidates),
        "mining/kept": float(filtered.allowed.sum()),
        **{f"mining/removed_{name}": float(count) for name, count in filtered.removed.items()},
        **{f"mining/batch_similarity_{k}": v for k, v in similarity_percentiles(pair_sims).items()},
        "mining/random_batch_similarity_mean": float(random_sims.mean()),
        "mining/false_negatives_flagged": float((false_negatives >= 0).sum()),
        "mining/false_negative_pairs_in_batches": float(false_negative_pairs(plan, false_negatives)),
    }
    if previous is not None and previous.plan is not None:
        metrics["mining/churn"] = plan_churn(previous.plan, plan)
    similarities = {"random batches": random_sims, f"mined plan v{version}": pair_sims}
    return RefreshReport(version, metrics, plan=plan, similarities=similarities)
