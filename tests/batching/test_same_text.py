"""No-duplicates batches for pairs: rows that share a text (a headline with several
paraphrases) are flagged as each other's false negatives and land in different batches."""

from __future__ import annotations

import numpy as np

from pipeline.batching.same_text import rows_sharing_a_text
from pipeline.config.loading import load_config
from pipeline.training.refresh import random_batches


def _brute_force_partners(texts: np.ndarray) -> list[set[int]]:
    """Each row's partners, by comparing every two rows' sets of texts."""
    sets = [set(t.tolist()) - {-1} for t in texts]
    return [{s for s in range(len(sets)) if s != r and sets[r] & sets[s]} for r in range(len(sets))]


def _listed(matrix: np.ndarray) -> list[set[int]]:
    return [set(row[row >= 0].tolist()) for row in matrix]


def test_partners_are_every_row_sharing_any_text():
    rng = np.random.default_rng(3)
    # 300 rows over 120 texts: anchors, positives and (some) given negatives collide often,
    # across columns too (a row's positive is another's anchor).
    texts = rng.integers(0, 120, size=(300, 3))
    texts[rng.random(300) < 0.5, 2] = -1
    texts[:5, 1] = texts[:5, 0]  # a row naming one text twice
    matrix = rows_sharing_a_text(texts)
    assert matrix is not None and matrix.dtype == np.int64
    assert _listed(matrix) == _brute_force_partners(texts)
    for row in matrix:  # each partner once, ascending, then padding
        present = row[row >= 0]
        assert np.array_equal(present, np.unique(present)) and (row[len(present) :] == -1).all()


def test_no_shared_text_gives_none():
    texts = np.stack([np.arange(50), np.arange(50, 100), np.full(50, -1)], axis=1)
    assert rows_sharing_a_text(texts) is None


def test_a_large_group_is_capped_and_still_links_every_member():
    texts = np.stack([np.zeros(40, dtype=np.int64), np.arange(1, 41), np.full(40, -1)], axis=1)
    matrix = rows_sharing_a_text(texts, max_partners=5)
    assert matrix is not None and matrix.shape == (40, 5)
    listed = _listed(matrix)
    # Along a ring: each member with its next five; read both ways (as the separation reads
    # the matrix), with the five before it too.
    assert listed == [{(r + d) % 40 for d in range(1, 6)} for r in range(40)]


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
