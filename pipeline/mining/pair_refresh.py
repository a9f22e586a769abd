"""The pairs task's refresh, after the encode: search and filter (:func:`mine_hard_negatives`),
attach each anchor's negatives to its row as the rows' negatives column, describe it.
"""

from __future__ import annotations

import numpy as np

from pipeline.data.triplets import Triplets
from pipeline.mining.hard_negatives import mine_hard_negatives
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.mining_metrics import mining_metrics, random_pair_similarities
from pipeline.mining.random_negatives import random_pool_negatives
from pipeline.mining.refresh_report import RefreshReport


def refresh_pairs(
    embeddings: np.ndarray,
    *,
    triplets: Triplets,
    keys: np.ndarray,
    settings: MinerSettings,
    version: int,
    previous: RefreshReport | None,
) -> RefreshReport:
    """Each anchor's negatives among the candidate pool (``data.pool``, else the distinct
    positives), as one column beside the training rows.

    Args:
        embeddings: ``(texts, dim)`` the corpus's texts under the newest weights.
        triplets: the training rows as positions into those texts.
        keys: ``(texts,)`` :func:`~pipeline.mining.text_keys.text_keys` of the texts.
        settings: filters, search, seed and ``random_negatives``.
        version: this refresh's version (it seeds the search and the draws).
        previous: the last refresh's report, for the churn.

    Returns:
        The report with ``negatives``: ``(rows, m)`` text positions, -1 where none.
    """
    pool = triplets.candidate_pool()
    # Gathered once: the search and the random baseline read the same rows.
    anchor_vectors, pool_vectors = embeddings[triplets.anchor], embeddings[pool]
    mined = mine_hard_negatives(
        anchor_vectors=anchor_vectors,
        positive_vectors=embeddings[triplets.positive],
        pool_vectors=pool_vectors,
        anchor_keys=keys[triplets.anchor],
        positive_keys=keys[triplets.positive],
        pool_keys=keys[pool],
        filters=settings.filters,
        search=settings.search,
        seed=settings.seed + version,
    )
    negatives = np.where(mined.negatives >= 0, pool[np.maximum(mined.negatives, 0)], -1)  # text positions
    if settings.random_negatives:
        drawn = random_pool_negatives(
            keys, triplets.anchor, triplets.positive, pool, settings.random_negatives, settings.seed + version
        )
        negatives = np.concatenate([negatives, drawn], axis=1)
    random_pairs = random_pair_similarities(anchor_vectors, pool_vectors, settings.seed)
    metrics = {
        **mining_metrics(mined, random_pairs=random_pairs, pool_size=len(pool)),
        "mining/random_negatives": float(settings.random_negatives * len(triplets)),
    }
    if previous is not None and previous.negatives is not None:
        # The share of the rows' mined negatives this refresh replaced: near 0 says the model
        # barely moved and the refresh bought nothing.
        metrics["mining/churn"] = float((previous.negatives != negatives).mean())
    found = mined.scores[mined.negatives >= 0]
    similarities = {"random pairs": random_pairs, f"mined negatives v{version}": found} if len(found) else {}
    return RefreshReport(version, metrics, negatives=negatives, similarities=similarities)
