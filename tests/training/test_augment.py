"""ESimCSE word repetition on token ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.data.tokenized import TokenizedCorpus
from pipeline.training.augment import repeat_words
from pipeline.training.unsupervised_step import two_views

PAD, CLS, SEP = 0, 101, 102


def _batch():
    rows = [[CLS, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, SEP], [CLS, 20, 21, SEP], [CLS, SEP]]
    width = max(map(len, rows))
    ids = np.array([r + [PAD] * (width - len(r)) for r in rows])
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return rows, ids, mask


def _dedupe_adjacent(row):
    out = [row[0]]
    for token in row[1:]:
        if token != out[-1]:
            out.append(token)
    return out


def test_repetition_duplicates_in_place_within_bounds():
    rows, ids, mask = _batch()
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(300):
        new_ids, new_mask = repeat_words(ids, mask, 0.32, rng, PAD)
        for original, row_ids, row_mask in zip(rows, new_ids, new_mask, strict=True):
            row = row_ids[row_mask.astype(bool)].tolist()
            assert (row_ids[~row_mask.astype(bool)] == PAD).all()
            assert row[0] == CLS and row[-1] == SEP and row.count(CLS) == 1 and row.count(SEP) == 1
            assert _dedupe_adjacent(row) == original  # only in-place repeats, order kept
            inner = len(original) - 2
            assert 0 <= len(row) - len(original) <= min(inner, max(2, int(0.32 * inner)))
        lengths.append(int(new_mask[0].sum()) - len(rows[0]))
    # The first row (10 inner tokens) repeats 0..3 tokens, each count drawn.
    assert set(lengths) == {0, 1, 2, 3}


def test_two_views_pads_both_views_to_one_width():
    _, ids, mask = _batch()
    lists = [list(r[m.astype(bool)]) for r, m in zip(ids, mask, strict=True)]
    table = pa.table({"id": [1, 2, 3], "input_ids": pa.array(lists, pa.list_(pa.int32()))})
    corpus = TokenizedCorpus(table, PAD)
    rows = np.array([0, 1, 2])
    plain_ids, plain_mask = two_views(corpus, rows, 0.0, np.random.default_rng(0))
    assert np.array_equal(plain_ids[:3], plain_ids[3:]) and np.array_equal(plain_ids[:3], ids)
    aug_ids, aug_mask = two_views(corpus, rows, 0.5, np.random.default_rng(1))
    assert aug_ids.shape == aug_mask.shape and aug_ids.shape[0] == 6
    assert np.array_equal(aug_ids[:3, : ids.shape[1]], ids) and (aug_ids[:3, ids.shape[1] :] == PAD).all()
    assert aug_mask[3:].sum() >= mask.sum()
