"""Paraphrase retrieval (MRR@10, recall@1) against hand-worked answers and an independent
brute force that enumerates every tie-break order; and its place in score_embeddings."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pipeline.evaluation.retrieval import paraphrase_retrieval
from pipeline.evaluation.scoring import STSEvalSet, average_row, format_table, score_embeddings, score_summary
from pipeline.evaluation.sts import STSPairs


def _unit_at(degrees: list[float]) -> np.ndarray:
    """2-d unit vectors at these angles: cosine falls with the angle between two of them."""
    radians = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def test_answer_at_rank_two_scores_half_and_no_recall():
    # query at 0 degrees, a distractor at 10, the answer at 20, two more beyond it
    unit = _unit_at([0, 10, 20, 60, 90])
    texts = ["q", "near", "answer", "far", "farther"]
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0]), answer_rows=np.array([2])
    )
    assert got.queries == 1
    assert got.mrr_at_10 == pytest.approx(50.0)
    assert got.recall_at_1 == pytest.approx(0.0)


def test_answer_first_and_beyond_the_cut_off():
    unit = _unit_at([0, 5, 30, 40, 50])
    texts = ["q1", "a1", "x", "y", "q2"]
    # q1 -> a1: rank 1. q2 (50 deg) -> a1 (45 deg away): y (10 away) and x (20 away) come
    # first, q1 (50 away) after it: rank 3
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0, 4]), answer_rows=np.array([1, 1])
    )
    assert got.queries == 2
    assert got.mrr_at_10 == pytest.approx(100 * (1 + 1 / 3) / 2)
    assert got.recall_at_1 == pytest.approx(50.0)
    # with k=2 the second query's rank 3 earns nothing
    cut = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0, 4]), answer_rows=np.array([1, 1]), k=2
    )
    assert cut.mrr_at_10 == pytest.approx(50.0)


def test_ties_count_in_expectation():
    # two distractors at exactly the answer's angle: rank uniform on 1..3
    unit = _unit_at([0, 30, 30, 30, 80])
    texts = ["q", "answer", "twin-1", "twin-2", "far"]
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0]), answer_rows=np.array([1])
    )
    assert got.mrr_at_10 == pytest.approx(100 * (1 + 1 / 2 + 1 / 3) / 3)
    assert got.recall_at_1 == pytest.approx(100 / 3)
    # a collapsed model (every embedding equal) scores chance, not 100
    flat = np.tile([[1.0, 0.0]], (5, 1))
    chance = paraphrase_retrieval(
        flat, texts, pool_rows=np.arange(5), query_rows=np.array([0]), answer_rows=np.array([1])
    )
    assert chance.recall_at_1 == pytest.approx(100 / 4)  # four candidates besides the query


def test_duplicates_of_the_query_text_never_compete():
    # the pool holds the query's text twice more (a second row each, embedded a bit apart,
    # as different truncation or casing could); both would outrank the answer
    unit = _unit_at([0, 1, 2, 20, 40])
    texts = ["same", "same", "same", "answer", "other"]
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0]), answer_rows=np.array([3])
    )
    assert got.mrr_at_10 == pytest.approx(100.0) and got.recall_at_1 == pytest.approx(100.0)


def test_other_answers_of_the_query_are_filtered_and_answer_copies_count_once():
    # q has two gold answers; each pair ranks its own answer against the rest of the pool only
    unit = _unit_at([0, 10, 20, 30, 25])
    texts = ["q", "a1", "a2", "x", "a2"]  # a2 held twice: row 4 ranks better than row 2
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(5), query_rows=np.array([0, 0]), answer_rows=np.array([1, 2])
    )
    assert got.queries == 2
    # q->a1: a2 (both rows) filtered, x below -> rank 1. q->a2: a1 filtered, best copy (25 deg)
    # beats x (30 deg) -> rank 1
    assert got.mrr_at_10 == pytest.approx(100.0) and got.recall_at_1 == pytest.approx(100.0)


def test_identical_and_repeated_pairs():
    unit = _unit_at([0, 10, 20])
    texts = ["q", "a", "q"]
    # row 2 is the query's text again: that pair has nothing to retrieve; the (0, 1) pair is
    # listed twice and counts once
    got = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(3), query_rows=np.array([0, 0, 0]), answer_rows=np.array([2, 1, 1])
    )
    assert got.queries == 1 and got.recall_at_1 == pytest.approx(100.0)
    none = paraphrase_retrieval(
        unit, texts, pool_rows=np.arange(3), query_rows=np.array([0]), answer_rows=np.array([2])
    )
    assert none.queries == 0 and math.isnan(none.mrr_at_10) and math.isnan(none.recall_at_1)


def _brute_force_ranks(unit, texts, pool_rows, query_rows, answer_rows):
    """For each scored pair, the answer's rank in every order of the candidates that sorts them
    by cosine (ties in any order), each order equally likely. Shares no code with the
    implementation."""
    pairs = []
    for q, a in zip(query_rows, answer_rows, strict=True):
        if texts[q] != texts[a] and (texts[q], texts[a]) not in [(texts[x], texts[y]) for x, y in pairs]:
            pairs.append((q, a))
    ranks = []
    for q, a in pairs:
        golds = {texts[y] for x, y in pairs if texts[x] == texts[q]}

        def cos(row, q=q):
            return round(sum(float(u) * float(v) for u, v in zip(unit[q], unit[row], strict=True)), 9)

        answer_score = max([cos(a)] + [cos(r) for r in pool_rows if texts[r] == texts[a]])
        items = [answer_score]  # item 0 is the answer
        items += [cos(r) for r in pool_rows if texts[r] != texts[q] and texts[r] not in golds]
        orders = [
            order
            for order in itertools.permutations(range(len(items)))
            if all(items[i] >= items[j] for i, j in itertools.pairwise(order))
        ]
        ranks.append([order.index(0) + 1 for order in orders])
    return ranks


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_with_ties_and_duplicate_texts(seed):
    rng = np.random.default_rng(seed)
    # few directions and few texts: many exact ties and many rows sharing a text
    unit = _unit_at(list(rng.choice([0, 15, 30, 45, 60, 90, 120], size=7)))
    texts = [f"t{int(i)}" for i in rng.integers(0, 5, size=7)]
    pool_rows = np.arange(7)
    query_rows, answer_rows = rng.integers(0, 7, size=4), rng.integers(0, 7, size=4)
    ranks = _brute_force_ranks(unit, texts, pool_rows, query_rows, answer_rows)
    for k in (1, 2, 10):
        got = paraphrase_retrieval(
            unit, texts, pool_rows=pool_rows, query_rows=query_rows, answer_rows=answer_rows, k=k
        )
        assert got.queries == len(ranks)
        if ranks:
            mrr = 100 * np.mean([np.mean([1 / r if r <= k else 0.0 for r in rs]) for rs in ranks])
            recall = 100 * np.mean([np.mean([r == 1 for r in rs]) for rs in ranks])
            assert got.mrr_at_10 == pytest.approx(mrr, abs=1e-9)
            assert got.recall_at_1 == pytest.approx(recall, abs=1e-9)


class _CharTokenizer:
    """Enough of a tokenizer for STSEvalSet: one id per character."""

    pad_token_id = 0

    def __call__(self, texts, **_kwargs):
        return {"input_ids": [[1 + ord(c) % 50 for c in text] for text in texts]}


def test_score_embeddings_reports_retrieval_per_file_over_its_own_sentences():
    first = STSPairs(
        "dev",
        "dev.csv",
        "csv",
        ["q", "q", "other"],
        ["answer", "near", "far"],
        np.array([5.0, 1.0, 4.5]),
    )
    second = STSPairs("zh", "zh.txt", "cnsd", ["p"], ["p"], np.array([5.0]))  # no pair to retrieve
    eval_set = STSEvalSet([first, second], _CharTokenizer(), 8)
    angle = {"q": 0, "answer": 20, "near": 10, "other": 90, "far": 60, "p": 5}
    texts = eval_set.table.column("text").to_pylist()
    embeddings = 3.0 * _unit_at([angle[t] for t in texts])  # raw, un-normalised rows

    dev, zh = score_embeddings(eval_set, embeddings)
    # q -> answer: "near" (10 deg) is closer -> rank 2; other (90) -> far (60): "answer" at 20
    # and "near" at 10 are farther from 90 deg, so far is first
    assert dev.retrieval_queries == 2
    assert dev.mrr_at_10 == pytest.approx(100 * (0.5 + 1) / 2)
    assert dev.recall_at_1 == pytest.approx(50.0)
    metrics = dev.metrics()
    assert metrics["sts_dev_mrr_at_10"] == pytest.approx(75.0)
    assert metrics["sts_dev_recall_at_1"] == pytest.approx(50.0)
    # the second file's only pair is one text twice: no score, and no NaN metric logged
    assert zh.retrieval_queries == 0 and math.isnan(zh.mrr_at_10)
    assert not any("mrr" in key or "recall" in key for key in zh.metrics())

    average = average_row([dev, zh])  # a file without queries does not pull the mean to NaN
    assert average.mrr_at_10 == pytest.approx(75.0) and average.retrieval_queries == 2
    assert score_summary([dev])["mrr_at_10"] == pytest.approx(75.0)
    assert score_summary([zh])["mrr_at_10"] is None
    header = format_table([dev, zh]).splitlines()[0].split()
    assert header[:5] == ["file", "pairs", "spearman", "mrr@10", "recall@1"]
