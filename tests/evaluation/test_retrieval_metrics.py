"""nDCG@10, MRR@10 and Recall@k (pipeline.evaluation.retrieval_metrics) against hand-worked values
and an independent brute force that ranks every candidate and averages the textbook definitions
over every tie-break order."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

import pipeline.evaluation.retrieval_metrics as rm
from pipeline.evaluation.retrieval_metrics import expected_reciprocal_rank, ranking_metrics


def _unit(rows: list[list[float]]) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_force(queries, corpus, relevance, excluded):
    """Per-query textbook metrics of full rankings, averaged over every order of tied candidates
    (exactly equal cosines, compared at 12 decimals), then over the scored queries."""
    per_query = []
    for q, grades in enumerate(relevance):
        candidates = [d for d in range(len(corpus)) if d not in excluded[q]]
        relevant = {d: g for d, g in grades.items() if g > 0 and d in candidates}
        if not relevant:
            continue
        score = {
            d: round(sum(a * b for a, b in zip(queries[q], corpus[d], strict=True)), 12) for d in candidates
        }
        levels = sorted(set(score.values()), reverse=True)
        groups = [[d for d in candidates if score[d] == level] for level in levels]
        ideal = sorted(relevant.values(), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        runs = []
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            ranking = [d for order in orders for d in order]
            dcg = sum(relevant.get(d, 0.0) / math.log2(i + 2) for i, d in enumerate(ranking[:10]))
            first = next(i for i, d in enumerate(ranking) if d in relevant) + 1
            runs.append(
                [
                    dcg / idcg,
                    1.0 / first if first <= 10 else 0.0,
                    *(len(set(ranking[:k]) & set(relevant)) / len(relevant) for k in (1, 10, 100)),
                ]
            )
        per_query.append(np.mean(runs, axis=0))
    return 100.0 * np.mean(per_query, axis=0), len(relevance) - len(per_query)


def _case():
    """Query 0 looks along x; documents at a few exact angles to it (ties by symmetry)."""
    s, c = 1.0, 1.0
    corpus = _unit(
        [
            [1, 0, 0],  # 0: the text of query 1 (and a perfect match for query 0)
            [3, s, 0],  # 1, 2: tied for query 0
            [3, 0, s],
            [2, s, 0],  # 3, 4, 5: tied for query 0
            [2, 0, s],
            [2, -s, 0],
            [1, c, 0],  # 6, 7
            [1, 0, c],
            [0, 1, 0],  # 8..13: orthogonal to query 0, tied
            [0, 0, 1],
            [0, 1, 1],
            [0, -1, 0],
            [0, 0, -1],
            [-1, 1, 0],  # 13: last
            [0, 1, 2],  # 14
        ]
    )
    queries = _unit([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 1], [1, 1, 1]])
    relevance = [
        {2: 2.0, 4: 1.0, 5: 1.0, 9: 3.0},  # graded, two tie groups, one relevant doc deep down
        {0: 1.0, 6: 1.0, 13: 1.0},  # doc 0 is its own text: dropped, not a candidate
        {11: 1.0, 1: 0.0},  # grade 0 is "not relevant"
        {},  # nothing relevant: skipped
        {6: 1.0, 10: 2.0, 1: 1.0},  # 6 and 10 tie first with 7, 1 comes later
    ]
    excluded = [[], [0], [], [], []]
    return queries, corpus, relevance, excluded


def test_matches_brute_force_over_every_tie_break():
    queries, corpus, relevance, excluded = _case()
    expected, skipped = _brute_force(queries, corpus, relevance, excluded)
    got = ranking_metrics(queries, corpus, relevance, excluded)
    assert (got.queries, got.skipped, got.corpus) == (4, 1, 15) and skipped == 1
    values = [got.ndcg_at_10, got.mrr_at_10, got.recall_at_1, got.recall_at_10, got.recall_at_100]
    assert values == pytest.approx(list(expected), abs=1e-9)


def test_hand_worked_values_without_ties():
    # query along x; documents at falling cosines; relevant: rank 2 (grade 1) and rank 4 (grade 2)
    corpus = _unit([[10, 1, 0], [10, 3, 0], [10, 6, 0], [10, 9, 0], [10, 20, 0]])
    got = ranking_metrics(_unit([[1, 0, 0]]), corpus, [{1: 1.0, 3: 2.0}])
    dcg = 1 / math.log2(3) + 2 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert got.ndcg_at_10 == pytest.approx(100 * dcg / idcg)
    assert got.mrr_at_10 == pytest.approx(50.0)
    assert (got.recall_at_1, got.recall_at_10, got.recall_at_100) == (0.0, 100.0, 100.0)


def test_cut_offs_and_chance_for_a_collapsed_model():
    # 150 documents, the relevant one at rank 12: outside @10, inside @100
    corpus = _unit([[1.0, 0.01 * i] for i in range(150)])
    got = ranking_metrics(_unit([[1.0, 0.0]]), corpus, [{11: 1.0}])
    assert (got.ndcg_at_10, got.mrr_at_10, got.recall_at_10, got.recall_at_100) == (0.0, 0.0, 0.0, 100.0)
    # every embedding equal: the relevant document is anywhere among 150, uniformly
    flat = np.tile([[1.0, 0.0]], (150, 1))
    chance = ranking_metrics(flat[:1], flat, [{0: 1.0}])
    assert chance.recall_at_1 == pytest.approx(100 / 150)
    assert chance.recall_at_10 == pytest.approx(100 * 10 / 150)
    assert chance.mrr_at_10 == pytest.approx(100 * sum(1 / r for r in range(1, 11)) / 150)


def test_expected_reciprocal_rank_of_the_first_of_several_tied_relevant():
    # 2 relevant among 4 tied candidates after 1 better one: enumerate the 6 placements
    placements = list(itertools.combinations(range(4), 2))
    expected = np.mean([1 / (1 + 1 + min(p)) for p in placements])
    got = expected_reciprocal_rank(np.array([1]), np.array([4]), np.array([2]), k=10)
    assert got[0] == pytest.approx(expected)
    cut = expected_reciprocal_rank(np.array([1]), np.array([4]), np.array([2]), k=2)
    assert cut[0] == pytest.approx(np.mean([1 / 2 if min(p) == 0 else 0.0 for p in placements]))


def test_blocks_do_not_change_the_scores(monkeypatch):
    rng = np.random.default_rng(0)
    corpus = _unit(rng.normal(size=(300, 8)).tolist())
    queries = _unit(rng.normal(size=(40, 8)).tolist())
    relevance = [
        {int(d): float(rng.integers(1, 3)) for d in rng.choice(300, 5, replace=False)} for _ in range(40)
    ]
    excluded = [[q] for q in range(40)]
    whole = ranking_metrics(queries, corpus, relevance, excluded)
    monkeypatch.setattr(rm, "CORPUS_BLOCK", 7)
    monkeypatch.setattr(rm, "PAIR_BLOCK", 3)
    blocked = ranking_metrics(queries, corpus, relevance, excluded)
    assert dataclasses.astuple(blocked) == pytest.approx(dataclasses.astuple(whole), abs=1e-9)


def test_no_scored_query_gives_nan():
    got = ranking_metrics(_unit([[1, 0]]), _unit([[1, 0]]), [{0: 1.0}], [[0]])
    assert (got.queries, got.skipped) == (0, 1) and math.isnan(got.ndcg_at_10)
