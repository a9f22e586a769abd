"""No-duplicates batches for pairs: rows that share a text (a headline with several
paraphrases) are flagged as each other's false negatives and land in different batches."""

from __future__ import annotations

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph
from pipeline.batching.same_text import rows_sharing_a_text
from pipeline.config.loading import load_config
from pipeline.training.plan_source import random_batches


def _brute_force_partners(texts: np.ndarray) -> list[set[int]]:
    """Each row's partners, by comparing every two rows' sets of texts."""
    sets = [set(t.tolist()) - {-1} for t in texts]
    return [{s for s in range(len(sets)) if s != r and sets[r] & sets[s]} for r in range(len(sets))]


def _listed(graph: FalseNegativeGraph, num_rows: int) -> list[set[int]]:
    """Each row's partners, read both ways (as the separation reads them)."""
    return [set(graph.partners(r).tolist()) for r in range(num_rows)]


def test_partners_are_every_row_sharing_any_text():
    rng = np.random.default_rng(3)
    # 300 rows over 120 texts: anchors, positives and (some) given negatives collide often,
    # across columns too (a row's positive is another's anchor).
    texts = rng.integers(0, 120, size=(300, 3))
    texts[rng.random(300) < 0.5, 2] = -1
    texts[:5, 1] = texts[:5, 0]  # a row naming one text twice
    graph = rows_sharing_a_text(texts)
    assert graph is not None
    assert _listed(graph, len(texts)) == _brute_force_partners(texts)
    # Each ordered pair listed once (two rows may share two texts), no row with itself.
    pairs = np.stack([graph.src, graph.dst], axis=1)
    assert len(np.unique(pairs, axis=0)) == len(pairs) and (graph.src != graph.dst).all()


def test_no_shared_text_gives_none():
    texts = np.stack([np.arange(50), np.arange(50, 100), np.full(50, -1)], axis=1)
    assert rows_sharing_a_text(texts) is None


def test_a_large_group_is_capped_and_still_links_every_member():
    texts = np.stack([np.zeros(40, dtype=np.int64), np.arange(1, 41), np.full(40, -1)], axis=1)
    graph = rows_sharing_a_text(texts, max_partners=5)
    assert graph is not None and np.bincount(graph.src, minlength=40).max() == 5
    # Along a ring: each member flags its next five; read both ways, the five before it too.
    assert _listed(graph, 40) == [
        {(r + d) % 40 for d in (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)} for r in range(40)
    ]


def test_same_text_pairs_stay_sparse_when_one_text_is_everywhere():
    # One text shared by 20,000 rows: the dense matrix this replaced was (20,000, 256) int64
    # (41 MB); the pairs are at most 256 a row, and only their pairs are stored.
    rows = 20_000
    texts = np.stack([np.zeros(rows, dtype=np.int64), np.arange(1, rows + 1), np.full(rows, -1)], axis=1)
    graph = rows_sharing_a_text(texts)
    assert graph is not None and (np.bincount(graph.src, minlength=rows) == 256).all()


def test_the_sparse_pairs_give_the_plan_the_dense_matrix_gave():
    """The same seed gives the same batches as the ``(n, m)`` matrix of the same flags did."""
    from pipeline.batching.samplers import random_plan

    rng = np.random.default_rng(5)
    texts = np.stack([np.repeat(np.arange(80), 4), 500 + np.arange(320), np.full(320, -1)], axis=1)
    graph = rows_sharing_a_text(texts)
    assert graph is not None
    width = np.bincount(graph.src, minlength=320).max()
    dense = np.full((320, width), -1, dtype=np.int64)
    for row in range(320):
        flagged = graph.dst[graph.src == row]
        dense[row, : len(flagged)] = flagged
    lengths = rng.integers(5, 30, size=320)
    for group_batches in (0, 4):
        sparse_plan = random_plan(
            320, 16, seed=3, lengths=lengths, group_batches=group_batches, false_negatives=graph
        )
        dense_plan = random_plan(
            320, 16, seed=3, lengths=lengths, group_batches=group_batches, false_negatives=dense
        )
        assert np.array_equal(sparse_plan.rows, dense_plan.rows)


def test_random_pair_batches_keep_rows_of_one_headline_apart():
    rng = np.random.default_rng(7)
    # 60 headlines with 5 paraphrases each (300 rows), batch 16: 19 batches. A random cut
    # puts two rows of one headline together in most batches.
    anchors = np.repeat(np.arange(60), 5)
    texts = np.stack([anchors, 100 + np.arange(300), np.full(300, -1)], axis=1)
    lengths = rng.integers(5, 30, size=300)
    cfg = load_config(overrides=["train.batch_size=16"])

    def shared_headlines(plan) -> int:
        return sum(len(b) - len(set(anchors[b].tolist())) for b in plan.batches())

    plain = random_batches(cfg, 1, lengths)
    apart = random_batches(cfg, 1, lengths, rows_sharing_a_text(texts))
    assert shared_headlines(plain) > 0
    assert shared_headlines(apart) == 0
    assert sorted(apart.rows.tolist()) == list(range(300))
    assert np.array_equal(apart.sizes, plain.sizes)
    grouped_cfg = load_config(overrides=["train.batch_size=16", "train.group_by_length=true"])
    assert shared_headlines(random_batches(grouped_cfg, 1, lengths, rows_sharing_a_text(texts))) == 0


def test_rows_without_shared_texts_get_the_plain_plan():
    lengths = np.arange(100) % 20 + 3
    cfg = load_config(overrides=["train.batch_size=16"])
    assert np.array_equal(random_batches(cfg, 4, lengths, None).rows, random_batches(cfg, 4, lengths).rows)
