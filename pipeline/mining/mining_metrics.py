"""What a mining logs, computed once from its result (:class:`~pipeline.mining.hard_negatives.MinedNegatives`)
for the offline job's ``mining/`` metrics and a training refresh's row of ``mining/refreshes.json``."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from pipeline.mining.hard_negatives import MinedNegatives
from pipeline.mining.negatives import FILTERS

RANDOM_PAIRS = 20_000
"""Most (anchor, random pool row) pairs in the baseline sample of :func:`random_pairs`."""


def random_pairs(
    anchors: int, pool: int, seed: int, max_pairs: int = RANDOM_PAIRS
) -> tuple[np.ndarray, np.ndarray]:
    """``min(max_pairs, anchors)`` seeded random anchors (with replacement) and as many random
    pool rows: the baseline mined negatives are read against, scored where the vectors are
    (:meth:`~pipeline.mining.encoded_texts.EncodedTexts.pair_scores`)."""
    rng = np.random.default_rng(seed)
    sample = rng.integers(anchors, size=min(max_pairs, anchors))
    return sample, rng.integers(pool, size=len(sample))


def similarity_percentiles(scores: np.ndarray) -> dict[str, float]:
    """``mean``, ``p10``, ``p50`` and ``p90`` of ``scores`` (empty when there are none)."""
    if not len(scores):
        return {}
    return {
        "mean": float(scores.mean()),
        **{f"p{q}": float(np.percentile(scores, q)) for q in (10, 50, 90)},
    }


def mining_metrics(mined: MinedNegatives, *, random_pairs: np.ndarray, pool_size: int) -> dict[str, float]:
    """What a run logs of one mining, from its table: the offline job's ``mining/`` metrics and
    a training refresh's row of ``mining/refreshes.json`` (which adds its encode time, version
    and churn).

    ``mining/passed_<filter>`` counts the candidates still in the running after each filter, to
    read beside ``mining/removed_<filter>``: where a run's negatives were lost.
    """

    def total(column: str) -> int:
        return int(pc.sum(mined.table.column(column)).as_py() or 0)

    found = mined.scores[mined.negatives >= 0]
    candidates = total("candidates")
    removed = {name: total(f"removed_{name}") for name in FILTERS}
    passed, left = {}, candidates
    for name in FILTERS:
        left -= removed[name]
        passed[name] = left
    return {
        **{f"mining/{stage}_s": seconds for stage, seconds in mined.seconds.items()},
        "mining/corpus_size": float(pool_size),
        "mining/candidates": float(candidates),
        "mining/kept": float(total("kept")),
        **{f"mining/removed_{name}": float(count) for name, count in removed.items()},
        **{f"mining/passed_{name}": float(count) for name, count in passed.items()},
        "mining/selected": float(len(found)),
        "mining/anchors_short": float((~(mined.negatives >= 0).all(axis=1)).sum()),
        "mining/positive_similarity_mean": float(np.mean(mined.table.column("positive_score"))),
        "mining/random_pair_similarity_mean": float(random_pairs.mean())
        if len(random_pairs)
        else float("nan"),
        **{f"mining/negative_similarity_{k}": v for k, v in similarity_percentiles(found).items()},
    }
