"""The pairs task's refresh, after the encode: search (where the texts are) and filter
(:func:`~pipeline.mining.hard_negatives.negatives_among`) chunk after chunk of rows, add any
random pool negatives, let a teacher score (and denoise) them, and describe the rows'
negatives column that results.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.core.positions import position_dtype
from pipeline.data.triplets import Triplets
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.hard_negatives import MinedNegatives, Searched, negatives_among
from pipeline.mining.index import estimate_index_bytes, index_summary
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.mining_metrics import mining_metrics, random_pairs
from pipeline.mining.random_negatives import random_pool_negatives
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.teacher_scores import PairScorer, TextsAt, scored_by_teacher
from pipeline.mining.text_keys import KnownPositives

CHUNK_ROWS = 65_536
"""Rows searched and filtered at once: their ``rows x top_k`` candidates, scores and masks
(about 2 KB a row at top_k 64) are all a refresh holds of the search, whatever the corpus size."""


def refresh_pairs(
    texts: EncodedTexts,
    *,
    triplets: Triplets,
    keys: np.ndarray,
    settings: MinerSettings,
    version: int,
    previous_negatives: np.ndarray | None,
    teacher: PairScorer | None = None,
    texts_at: TextsAt | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> RefreshReport:
    """Each anchor's negatives among the candidate pool (``data.pool``, else the distinct
    positives), as one column beside the training rows.

    Args:
        texts: the texts under the newest weights, searched over the pool
            (:meth:`~pipeline.data.triplets.Triplets.candidate_pool`).
        triplets: the training rows as positions into those texts.
        keys: ``(texts,)`` :func:`~pipeline.mining.text_keys.dense_keys` of the texts' ``text_key``.
        settings: filters, search, seed and ``random_negatives``.
        version: this refresh's version (it seeds the search and the draws).
        previous_negatives: the last refresh's negatives column, for the churn; None: none.
        teacher: scores each row's positive and negatives (``settings.teacher``), and drops
            the negatives it calls positives where ``settings.denoise_margin`` is set; None: none.
        texts_at: the texts at corpus positions, which the teacher reads (with ``teacher``).
        chunk_rows: rows mined at once; the column does not depend on it (but for
            ``mining.sampling: random``, whose draws are seeded per chunk).

    Returns:
        The report with ``negatives``: ``(rows, m)`` text positions, -1 where none, and with
        a teacher, ``teacher_scores`` beside them (:func:`~pipeline.mining.teacher_scores.teacher_scores`).
    """
    dtype = position_dtype(len(keys))
    # The pool in the column's dtype: mapping pool numbers to text positions makes no int64 copy.
    pool = triplets.candidate_pool().astype(dtype, copy=False)
    seed = settings.seed + version
    k = min(settings.search.top_k, len(pool))
    estimate = estimate_index_bytes(
        len(pool), texts.dim, k, texts.kind, queries=min(len(triplets), chunk_rows)
    )
    print(f"[mining] v{version}: {index_summary(texts.kind, len(pool), texts.dim, k, estimate)}", flush=True)
    # Every row's pairs, looked up by every chunk: a row's anchor text may have its other
    # positives in rows of another chunk.
    known = KnownPositives.of(keys[triplets.anchor], keys[triplets.positive], int(keys.max(initial=0)) + 1)
    chunks = []
    for lo in range(0, len(triplets), chunk_rows):
        anchor, positive = triplets.anchor[lo : lo + chunk_rows], triplets.positive[lo : lo + chunk_rows]
        # Searched and scored where the texts are: only top lists and scores come here.
        started = time.perf_counter()
        found = texts.search_positions(anchor, settings.search.top_k)
        searched = Searched(*found, seconds=time.perf_counter() - started, backend=texts.backend,
                            index_seconds=texts.build_seconds)  # fmt: skip
        chunks.append(
            negatives_among(
                searched,
                positive_scores=texts.pair_scores(anchor, positive),
                anchor_keys=keys[anchor],
                positive_keys=keys[positive],
                pool_keys=keys[pool],
                filters=settings.filters,
                seed=seed if lo == 0 else [seed, lo],
                known_positives=known,
            )  # fmt: skip
        )
    mined = MinedNegatives.concat(chunks)
    negatives = np.where(mined.negatives >= 0, pool[np.maximum(mined.negatives, 0)], -1)  # text positions
    if settings.random_negatives:
        drawn = random_pool_negatives(
            keys, triplets.anchor, triplets.positive, pool=pool, count=settings.random_negatives, seed=seed
        )
        negatives = np.concatenate([negatives, drawn], axis=1)
    scores, teacher_metrics, teacher_histogram = None, {}, {}
    if teacher is not None:
        assert texts_at is not None
        negatives, scores, teacher_metrics, teacher_histogram = scored_by_teacher(
            teacher, texts_at, anchors=triplets.anchor, positives=triplets.positive, negatives=negatives,
            denoise_margin=settings.denoise_margin, mined=mined.negatives.shape[1],
            keep=settings.keep_negatives or mined.negatives.shape[1], version=version,
        )  # fmt: skip
    sample, partners = random_pairs(len(triplets), len(pool), settings.seed)
    random_similarities = texts.pair_scores(triplets.anchor[sample], pool[partners])
    metrics = {
        **mining_metrics(mined, random_pairs=random_similarities, pool_size=len(pool)),
        "mining/random_negatives": float(settings.random_negatives * len(triplets)),
        **teacher_metrics,
    }
    if previous_negatives is not None:
        # The share of the rows' mined negatives this refresh replaced: near 0 says the model
        # barely moved and the refresh bought nothing. The random columns behind them are drawn
        # anew at every version, so they would count as replaced even then.
        mined_columns = negatives.shape[1] - settings.random_negatives
        replaced = previous_negatives[:, :mined_columns] != negatives[:, :mined_columns]
        metrics["mining/churn"] = float(replaced.mean())
    found = mined.scores[mined.negatives >= 0]
    # The mined negatives between the random baseline and the positives: near the positives,
    # false negatives are likely.
    positives = mined.table.column("positive_score").to_numpy()
    similarities = (
        {"random pairs": random_similarities, "positives": positives, f"mined negatives v{version}": found}
        if len(found)
        else {}
    )
    return RefreshReport(
        version, metrics, negatives=negatives.astype(dtype, copy=False),
        teacher_scores=scores, similarities=similarities, teacher_histogram=teacher_histogram,
    )  # fmt: skip
