"""Paraphrase retrieval on an STS file: MRR@10 and recall@1 (x 100), from the embeddings the
STS scorer already has.

Spearman says whether a model orders pair similarities like the annotators; it says little about
what hard negatives are meant to improve, telling a sentence's paraphrase apart from the nearest
other sentences. The retrieval task measures that on the same file, at no extra encoding:

- a **query** is ``sentence1`` of each pair whose gold score is ``>=`` the file's
  ``positive_threshold`` (0.8 x its scale: 4 on the 0-5 scale of STS-B and CNSD), its
  **answer** is that pair's ``sentence2``;
- the **pool** is every distinct sentence of the file (both columns), so the distractors are
  the file's other sentences, many of them on the same topic;
- a query never competes with itself: pool rows with the query's text are left out, and so are
  the other gold answers of the same query text ("filtered" ranking, as in link prediction: a
  second correct answer ranked first is no error of the first answer's);
- a pair whose two sentences are the same text is skipped (nothing to retrieve), and a pair
  that occurs twice counts once;
- ties are broken uniformly at random, in expectation: with ``g`` candidates strictly above the
  answer and ``t`` tied with it, the answer's rank is uniform on ``g+1 .. g+t+1``. A collapsed
  model (every embedding the same) therefore scores about what chance does, not 100.

Pure numpy on L2-normalised rows; queries are scored in blocks so memory stays bounded on
large files.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.evaluation.retrieval_metrics import TIE_TOLERANCE, expected_reciprocal_rank

QUERY_BLOCK = 1024
"""Queries scored per matrix product: bounds the (queries x pool) similarity block."""


@dataclass(frozen=True)
class RetrievalScore:
    """Paraphrase retrieval on one STS file."""

    queries: int
    """Positive pairs scored (identical-text pairs and repeated pairs left out)."""
    mrr_at_10: float
    """Mean reciprocal rank of the answer, 0 beyond rank ``k`` (10 unless asked otherwise), x 100
    (NaN: no queries)."""
    recall_at_1: float
    """Share of queries whose answer ranks first, x 100 (NaN: no queries)."""


def paraphrase_retrieval(
    unit: np.ndarray,
    texts: Sequence[Hashable],
    *,
    pool_rows: np.ndarray,
    query_rows: np.ndarray,
    answer_rows: np.ndarray,
    k: int = 10,
) -> RetrievalScore:
    """MRR@k and recall@1 of finding each query's answer among the pool.

    Args:
        unit: ``(rows, dim)`` L2-normalised embeddings.
        texts: the text (or any key) of each row of ``unit``: rows with equal texts are the same
            sentence, whichever row holds it.
        pool_rows: rows of ``unit`` that form the candidate pool (may hold a text twice).
        query_rows, answer_rows: one (query, answer) row pair per positive STS pair.
        k: the cut-off of the reciprocal rank.

    Returns:
        The scores; NaN scores and ``queries == 0`` when no pair is left to score.
    """
    pool_rows = np.asarray(pool_rows, dtype=np.int64)
    where: dict[Hashable, list[int]] = {}  # text -> its positions in the pool
    for position, row in enumerate(pool_rows):
        where.setdefault(texts[row], []).append(position)

    # one query per distinct (query text, answer text): a pair listed twice counts once, and a
    # pair whose sentences are the same text has nothing to retrieve
    first_rows: dict[tuple[Hashable, Hashable], tuple[int, int]] = {}
    for q, a in zip(np.asarray(query_rows), np.asarray(answer_rows), strict=True):
        if texts[q] != texts[a]:
            first_rows.setdefault((texts[q], texts[a]), (int(q), int(a)))
    distinct = list(first_rows)
    answers_of: dict[Hashable, set[Hashable]] = {}
    for query_text, answer_text in distinct:
        answers_of.setdefault(query_text, set()).add(answer_text)

    if not distinct:
        return RetrievalScore(0, float("nan"), float("nan"))
    pool = unit[pool_rows]
    reciprocal, first = [], []
    for start in range(0, len(distinct), QUERY_BLOCK):
        block = distinct[start : start + QUERY_BLOCK]
        rows = [first_rows[key] for key in block]
        q_rows = np.array([q for q, _ in rows])
        a_rows = np.array([a for _, a in rows])
        sims = unit[q_rows] @ pool.T  # (block, pool)
        candidate = np.ones(sims.shape, dtype=bool)
        answer_sim = np.einsum("ij,ij->i", unit[q_rows], unit[a_rows])
        for i, (query_text, answer_text) in enumerate(block):
            for text in answers_of[query_text] | {query_text}:  # the query itself, all its answers
                candidate[i, where.get(text, [])] = False
            copies = where.get(answer_text, [])
            if copies:  # the answer is found wherever a copy of it ranks best
                answer_sim[i] = max(answer_sim[i], sims[i, copies].max())
        gap = sims - answer_sim[:, None]
        greater = ((gap > TIE_TOLERANCE) & candidate).sum(1)
        tied = ((np.abs(gap) <= TIE_TOLERANCE) & candidate).sum(1)
        # the answer and its ``tied`` rivals share ranks greater+1 .. greater+tied+1
        reciprocal.append(expected_reciprocal_rank(greater, tied + 1, np.ones(len(tied)), k))
        first.append(np.where(greater == 0, 1.0 / (tied + 1), 0.0))
    mrr = float(np.concatenate(reciprocal).mean())
    recall = float(np.concatenate(first).mean())
    return RetrievalScore(len(distinct), 100.0 * mrr, 100.0 * recall)


def nan_mean(values: Sequence[float]) -> float:
    """Mean over the values that are not NaN (NaN when none is): files without positive
    pairs have no retrieval score and must not pull an average to NaN."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")
