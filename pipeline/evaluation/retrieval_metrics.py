"""Ranking metrics of a retrieval set: nDCG@10, MRR@10 and Recall@1/@10/@100 (x 100).

Definitions (BEIR / pytrec_eval, per query, then averaged over the scored queries):

- **nDCG@10**: DCG@10 = sum over the top 10 of ``rel / log2(rank + 1)`` with the judged grade
  as the gain (binary qrels: 1), divided by the IDCG@10 of the ideal order of that query's
  relevant documents.
- **MRR@10**: ``1 / rank`` of the first relevant document, 0 when none is in the top 10.
- **Recall@k**: the share of the query's relevant documents that are in its top ``k``.

Every relevant document counts (grade > 0; grades <= 0 are "not relevant", as in trec_eval).
Corpus documents with the query's own text are not candidates for that query (the caller names
them in ``excluded``), and a relevant document among them is dropped from the query's relevant
set: there is nothing to retrieve. Queries with no relevant document left are skipped and
counted.

Ties are broken uniformly at random, in expectation, as in
:mod:`pipeline.evaluation.retrieval`: a document with ``g`` candidates strictly above it and
``t`` candidates tied with it (itself included) sits at a rank uniform on ``g+1 .. g+t``.
nDCG and recall are linear in each document's rank, so their expectations are exact sums
over the documents; for MRR, the first relevant document of a tie group holding ``r`` relevant
of ``t`` candidates is at offset ``j`` with probability ``C(t-j, r-1) / C(t, r)``. The scores
are deterministic, and a collapsed model (every embedding equal) scores chance, not 100.

Pure numpy on L2-normalised rows: similarities are computed in (query block x corpus block)
tiles and reduced to per-(query, relevant document) counts at once, so memory stays bounded
by the tile size, whatever the corpus size; no full ranking is ever sorted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

TIE_TOLERANCE = 1e-9
"""Cosines closer than this count as equal. The same vector compared through two rows of a
matrix product can differ in the last bits (BLAS sums blocks in different orders), which
must not decide a rank; real differences between float32 model outputs are far larger."""

NDCG_AT = 10
MRR_AT = 10
RECALL_AT = (1, 10, 100)

CORPUS_BLOCK = 4096
"""Corpus documents per similarity tile."""
PAIR_BLOCK = 1024
"""(query, relevant document) pairs per query block: a tile's comparisons are
``PAIR_BLOCK x CORPUS_BLOCK`` (32 MiB of float64)."""


@dataclass(frozen=True)
class RankingMetrics:
    """The scores of one retrieval set, each x 100 (NaN when no query was scored)."""

    queries: int
    """Queries scored (with at least one relevant document)."""
    skipped: int
    """Queries without a relevant document (none judged, or only their own text): not scored."""
    corpus: int
    """Candidate documents."""
    ndcg_at_10: float
    mrr_at_10: float
    recall_at_1: float
    recall_at_10: float
    recall_at_100: float


def expected_reciprocal_rank(
    greater: np.ndarray, tied: np.ndarray, relevant: np.ndarray, k: int
) -> np.ndarray:
    """E[1/rank of the first relevant document, 0 beyond rank ``k``] under a random tie-break.

    Args:
        greater: ``(n,)`` candidates strictly above the best relevant document.
        tied: ``(n,)`` candidates tied with it, itself and the other tied relevant ones included (>= 1).
        relevant: ``(n,)`` relevant documents among the ``tied`` (1 .. tied).
        k: the cut-off.

    Returns:
        ``(n,)`` float64. With ``relevant == 1`` this is the mean of ``1/rank`` over the ranks
        ``greater+1 .. greater+tied``.
    """
    greater = np.asarray(greater, dtype=np.float64)
    tied = np.maximum(np.asarray(tied, dtype=np.float64), 1.0)
    relevant = np.clip(np.asarray(relevant, dtype=np.float64), 1.0, tied)
    out = np.zeros(len(greater))
    p = relevant / tied  # P(the first relevant one is at offset 1 of the tie group)
    for j in range(1, k + 1):
        hit = (j <= tied - relevant + 1) & (greater + j <= k)
        out += np.where(hit, p / (greater + j), 0.0)
        left = tied - j  # P(offset j+1) = P(offset j) * (t-j-r+1) / (t-j)
        p = np.where(left > 0, p * np.maximum(left - relevant + 1, 0.0) / np.maximum(left, 1.0), 0.0)
    return out


def _discount_prefix(k: int) -> np.ndarray:
    """``prefix[n]`` = sum of ``1/log2(rank+1)`` over ranks 1..n, for n = 0..k."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(2, k + 2)))])


def ranking_metrics(
    queries: np.ndarray,
    corpus: np.ndarray,
    relevance: Sequence[Mapping[int, float]],
    excluded: Sequence[Collection[int]] | None = None,
) -> RankingMetrics:
    """Score the retrieval of each query's relevant documents among the corpus by cosine similarity.

    Args:
        queries: ``(num_queries, dim)`` L2-normalised query embeddings (float64 keeps exact ties exact).
        corpus: ``(num_docs, dim)`` L2-normalised document embeddings.
        relevance: one mapping per query, corpus index -> graded relevance (qrels score; > 0 is
            relevant, the grade is the nDCG gain).
        excluded: one collection per query of corpus indices that are not its candidates (the
            documents with the query's own text); None: every document is a candidate.

    Returns:
        :class:`RankingMetrics`: nDCG@10, MRR@10, Recall@1/@10/@100, each x 100 and averaged over
        the scored queries (ties in expectation, see the module docstring).
    """
    queries = np.asarray(queries, dtype=np.float64)
    corpus = np.asarray(corpus, dtype=np.float64)
    if len(relevance) != len(queries) or (excluded is not None and len(excluded) != len(queries)):
        raise ValueError(f"{len(queries)} queries, {len(relevance)} relevance and exclusion lists")
    blocked = [sorted(set(excluded[q])) if excluded is not None else [] for q in range(len(queries))]
    judged: list[tuple[int, np.ndarray, np.ndarray]] = []  # (query, relevant docs, grades)
    for q, grades in enumerate(relevance):
        kept = {int(d): float(g) for d, g in grades.items() if g > 0 and int(d) not in set(blocked[q])}
        if kept:
            docs = np.fromiter(kept, dtype=np.int64, count=len(kept))
            judged.append((q, docs, np.fromiter(kept.values(), dtype=np.float64, count=len(kept))))
    skipped = len(queries) - len(judged)
    if not judged:
        nan = float("nan")
        return RankingMetrics(0, skipped, len(corpus), nan, nan, nan, nan, nan)

    prefix = _discount_prefix(max(NDCG_AT, *RECALL_AT))
    ndcg, mrr, recall = [], [], {k: [] for k in RECALL_AT}
    for block in _query_blocks(judged):
        greater, tied, pair_query, pair_score = _pair_counts(queries, corpus, block, blocked)
        grades = np.concatenate([g for _, _, g in block])
        low, high = greater, greater + tied  # each pair's rank is uniform on low+1 .. high
        dcg_gain = grades * (prefix[np.minimum(high, NDCG_AT)] - prefix[np.minimum(low, NDCG_AT)]) / tied
        found = {k: (np.minimum(high, k) - np.minimum(low, k)) / tied for k in RECALL_AT}
        for i, (_, docs, doc_grades) in enumerate(block):
            mine = pair_query == i
            ideal = np.sort(doc_grades)[::-1][:NDCG_AT]
            ndcg.append(dcg_gain[mine].sum() / (ideal / np.log2(np.arange(2, len(ideal) + 2))).sum())
            for k in RECALL_AT:
                recall[k].append(found[k][mine].sum() / len(docs))
            scores = pair_score[mine]
            best = int(np.argmax(scores))
            near_best = int((scores >= scores[best] - TIE_TOLERANCE).sum())
            mrr.append(
                expected_reciprocal_rank(
                    greater[mine][best : best + 1], tied[mine][best : best + 1], np.array([near_best]), MRR_AT
                )[0]
            )
    return RankingMetrics(
        queries=len(judged),
        skipped=skipped,
        corpus=len(corpus),
        ndcg_at_10=100.0 * float(np.mean(ndcg)),
        mrr_at_10=100.0 * float(np.mean(mrr)),
        recall_at_1=100.0 * float(np.mean(recall[1])),
        recall_at_10=100.0 * float(np.mean(recall[10])),
        recall_at_100=100.0 * float(np.mean(recall[100])),
    )


def _query_blocks(
    judged: list[tuple[int, np.ndarray, np.ndarray]],
) -> list[list[tuple[int, np.ndarray, np.ndarray]]]:
    """Consecutive queries grouped so that a block holds at most :data:`PAIR_BLOCK` relevant
    pairs (a query with more gets a block of its own)."""
    blocks: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[]]
    pairs = 0
    for item in judged:
        if blocks[-1] and pairs + len(item[1]) > PAIR_BLOCK:
            blocks.append([])
            pairs = 0
        blocks[-1].append(item)
        pairs += len(item[1])
    return blocks


def _pair_counts(
    queries: np.ndarray,
    corpus: np.ndarray,
    block: list[tuple[int, np.ndarray, np.ndarray]],
    blocked: list[list[int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every (query, relevant document) pair of ``block``: the candidates scoring strictly
    above the document, those tied with it (itself included), the pair's query (position in
    ``block``) and its score."""
    rows = np.array([q for q, _, _ in block])
    pair_query = np.concatenate([np.full(len(docs), i) for i, (_, docs, _) in enumerate(block)])
    pair_doc = np.concatenate([docs for _, docs, _ in block])
    pair_score = np.einsum("ij,ij->i", queries[rows[pair_query]], corpus[pair_doc])
    greater = np.zeros(len(pair_doc), dtype=np.int64)
    tied = np.zeros(len(pair_doc), dtype=np.int64)
    for start in range(0, len(corpus), CORPUS_BLOCK):
        stop = min(start + CORPUS_BLOCK, len(corpus))
        sims = queries[rows] @ corpus[start:stop].T  # (block queries, block docs)
        for i, q in enumerate(rows):
            out = [d - start for d in blocked[q] if start <= d < stop]
            sims[i, out] = -np.inf  # not a candidate
        gap = sims[pair_query] - pair_score[:, None]
        greater += (gap > TIE_TOLERANCE).sum(1)
        tied += (np.abs(gap) <= TIE_TOLERANCE).sum(1)
    return greater, np.maximum(tied, 1), pair_query, pair_score
