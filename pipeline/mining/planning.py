"""Neighbourhood mode's refresh: from the k-NN lists to the next epoch's plan.

The miner filters every row's neighbours (duplicates and likely false negatives out) and groups
the rows into batches with the sampler ``mining.batch_sampler`` names, each row's flagged false
negatives kept out of its batch. One place decides it, so a new sampler is one entry in
:mod:`pipeline.batching.registry` plus its function in ``pipeline/batching``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.batching.registry import build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.index import KnnResult, estimate_index_bytes, index_summary
from pipeline.mining.negatives import filter_candidates
from pipeline.mining.plan_quality import plan_metrics
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import duplicate_mask

SEARCH_CHUNK_ROWS = 65_536
"""Queries searched at once (the shards answer a chunk at a time)."""

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


def refresh_corpus(
    texts: EncodedTexts,
    *,
    keys: np.ndarray,
    settings: MinerSettings,
    version: int,
    previous: RefreshReport | None,
) -> RefreshReport:
    """The corpus task's refresh, after the encode: search the corpus against itself, filter
    each row's neighbours, plan the next epoch's batches, describe the plan.

    Args:
        texts: the corpus under the newest weights, every text a candidate
            (:class:`~pipeline.mining.encoded_texts.EmbeddedTexts` with no pool, or the
            miner's shards).
        keys: ``(rows,)`` :func:`~pipeline.mining.text_keys.text_keys` of the rows.
        settings: search, filters, sampler, batch size and seed.
        version: this refresh's version (it seeds the search and the plan).
        previous: the last refresh's report, for the churn.

    Returns:
        The report with ``plan``: the next order of rows.
    """
    s = settings
    n, seed = texts.rows, s.seed + version
    # Search: every row against the corpus, chunk after chunk of queries; each row finds
    # itself first, which the filter drops.
    k = min(s.search.top_k + 1, n)
    estimate = estimate_index_bytes(n, texts.dim, k, texts.kind)
    print(f"[mining] v{version}: {index_summary(texts.kind, n, texts.dim, k, estimate)}", flush=True)
    started = time.perf_counter()
    found = [texts.search(texts.vectors(np.arange(lo, min(lo + SEARCH_CHUNK_ROWS, n))), k)
             for lo in range(0, n, SEARCH_CHUNK_ROWS)]  # fmt: skip
    knn = KnnResult(
        np.concatenate([scores for scores, _ in found]), np.concatenate([rows for _, rows in found]),
        texts.backend, texts.build_seconds, time.perf_counter() - started,
    )  # fmt: skip
    del found
    # Filter: duplicates of a row's text, and likely false negatives, out of its candidates. Each
    # row is its own positive (unsupervised), so the relative margin is against 1.0.
    started = time.perf_counter()
    duplicate = duplicate_mask(knn.indices, keys, keys, keys)
    filtered = filter_candidates(knn.indices, knn.scores, np.ones(n, dtype=np.float32), duplicate, s.filters)
    itself = knn.indices == np.arange(n)[:, None]
    false_negatives = np.where(filtered.false_negative & ~itself, knn.indices, -1)
    # Order: the next epoch's batches, each row's flagged false negatives kept out of its batch.
    neighbours = np.where(filtered.allowed, knn.indices, -1)
    inputs = SamplerInputs(neighbours, knn.scores, false_negatives, s.batch_size, seed, version)
    plan = build_plan(s.plan.batch_sampler, inputs)
    plan_seconds = time.perf_counter() - started
    # Measure: how hard and how safe the plan is, against random pairs of rows.
    metrics, similarities = plan_metrics(
        texts, plan, knn=knn, filtered=filtered, false_negatives=false_negatives,
        previous=previous.plan if previous is not None else None, seed=s.seed,
    )  # fmt: skip
    metrics = {
        "mining/index_s": knn.index_seconds,
        "mining/search_s": knn.search_seconds,
        "mining/plan_s": plan_seconds,
        "mining/corpus_size": float(n),
        "mining/index_estimated_mib": estimate / 2**20,
        **metrics,
    }
    return RefreshReport(version, metrics, plan=plan, similarities=similarities)
