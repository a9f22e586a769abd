"""Each epoch's negatives drawn from a deeper mined list (``mining.sampling: random``), and the
share a rank trains with: checked against a plain per-row draw and against the mined column."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.batching.negative_draw import draw_negatives
from pipeline.config.loading import load_config
from pipeline.data.triplets import Triplets
from pipeline.training.plan_source import PlanSource, make_shares, write_mined


def _mined_column(rows: int, mined: int, rng: np.random.Generator) -> np.ndarray:
    """Distinct text positions a row, nearest first, some rows short (trailing -1)."""
    column = np.stack([rng.choice(1000, size=mined, replace=False) for _ in range(rows)])
    present = rng.integers(0, mined + 1, size=rows)
    column[np.arange(mined)[None, :] >= present[:, None]] = -1
    return column


def test_a_draw_keeps_a_subset_of_each_rows_mined_negatives_in_their_mined_order():
    rng = np.random.default_rng(0)
    column = _mined_column(500, 7, rng)
    drawn, _ = draw_negatives(column, mined=7, keep=3, seed=11)
    assert drawn.shape == (500, 3)
    for row, picks in zip(column, drawn, strict=True):
        present = row[row >= 0].tolist()
        kept = picks[picks >= 0].tolist()
        # As many as the row has, up to 3, absent slots last.
        assert len(kept) == min(3, len(present)) and (picks[len(kept) :] == -1).all()
        assert set(kept) <= set(present) and len(set(kept)) == len(kept)
        assert kept == [t for t in present if t in kept]  # nearest first, as mined


def test_the_same_seed_draws_the_same_and_epochs_cover_the_mined_list_uniformly():
    rng = np.random.default_rng(1)
    column = np.tile(np.arange(7), (2000, 1))  # every row: positions 0..6, all present
    assert np.array_equal(
        draw_negatives(column, mined=7, keep=3, seed=5)[0], draw_negatives(column, mined=7, keep=3, seed=5)[0]
    )
    assert not np.array_equal(
        draw_negatives(column, mined=7, keep=3, seed=5)[0], draw_negatives(column, mined=7, keep=3, seed=6)[0]
    )
    # Uniform: each of the 7 is drawn for 3/7 of the rows (2000 rows: sd 1.1 points).
    counts = np.bincount(
        draw_negatives(column, mined=7, keep=3, seed=int(rng.integers(1 << 30)))[0].ravel(), minlength=7
    )
    assert np.allclose(counts / 2000, 3 / 7, atol=0.05)


def test_extra_columns_ride_along_and_keeping_all_changes_nothing():
    column = np.array([[5, 6, 7, 90], [8, -1, -1, 91]])  # 3 mined, then a random negative
    drawn, _ = draw_negatives(column, mined=3, keep=2, seed=0)
    assert drawn[:, 2].tolist() == [90, 91] and drawn[1].tolist() == [8, -1, 91]
    assert draw_negatives(column, mined=3, keep=3, seed=0)[0] is column
    with pytest.raises(ValueError, match="cannot draw 4 of 3"):
        draw_negatives(column, mined=3, keep=4, seed=0)


def test_a_ranks_share_trains_on_the_epochs_draw_and_the_next_epoch_draws_again(tmp_path):
    cfg = load_config(
        None,
        ["task=pairs", "data.path=rows.jsonl", "train.batch_size=4", "mining.num_negatives=2",
         "mining.sampling=random", "mining.range_max=4"],
    )  # fmt: skip
    rows = 16
    triplets = Triplets(np.arange(rows), np.arange(rows) + 100, np.full(rows, -1))
    mined = (200 + np.arange(rows * 4).reshape(rows, 4)).astype(np.int32)  # as a refresh mines it
    uri = write_mined(str(tmp_path), "v1-negatives.npz", negatives=mined)
    lengths = np.full(300, 5, dtype=np.int32)
    epochs = []
    for seed in (3, 4):
        source = PlanSource(1, seed=seed, negatives=uri)
        taken = {}
        for share in make_shares(source, cfg, lengths, triplets, world=2):
            assert share.negatives.shape == (len(share.rows), 2)
            assert share.negatives.dtype == np.int32  # half of int64's bytes, all the way to the rank
            for row, negatives in zip(share.rows.tolist(), share.negatives.tolist(), strict=True):
                assert set(negatives) <= set(mined[row].tolist())
                taken[row] = negatives
            # A rank encodes the texts of its drawn negatives only, not the whole mined list.
            drawn = set(share.negatives.ravel().tolist())
            assert drawn <= set(share.texts.tolist())
            assert not set(mined[share.rows].ravel().tolist()) - drawn & set(share.texts.tolist())
        assert sorted(taken) == list(range(rows))
        epochs.append(taken)
    assert epochs[0] != epochs[1]  # a pool mined once still varies from epoch to epoch


def test_random_sampling_keeps_the_rank_window_and_top_sampling_the_negatives_an_epoch_uses():
    base = ["task=pairs", "data.path=rows.jsonl", "mining.num_negatives=3"]
    assert load_config(None, base).negatives_mined == 3
    assert load_config(None, [*base, "mining.sampling=random"]).negatives_mined == 64  # top_k
    assert load_config(None, [*base, "mining.sampling=random", "mining.range_max=8"]).negatives_mined == 8
    window = ["mining.sampling=random", "mining.range_min=2", "mining.range_max=8"]
    assert load_config(None, [*base, *window]).negatives_mined == 6
    # The corpus task plans batches; its mined negatives are only the offline job's columns.
    assert load_config(None, ["mining.num_negatives=3", "mining.sampling=random"]).negatives_mined == 3


def test_the_teachers_scores_are_drawn_with_their_negatives():
    rng = np.random.default_rng(3)
    column = np.concatenate([_mined_column(300, 6, rng), 900 + np.arange(300)[:, None]], axis=1)  # +1 random
    # Each negative's score is a function of its text here, the positive's of its row.
    scores = np.concatenate(
        [np.arange(300)[:, None] / 1000.0, np.where(column >= 0, column / 7.0, np.nan)], axis=1
    ).astype(np.float32)
    drawn, drawn_scores = draw_negatives(column, mined=6, keep=2, seed=4, teacher_scores=scores)
    assert drawn_scores.shape == (300, 1 + 2 + 1)
    np.testing.assert_array_equal(drawn_scores[:, 0], scores[:, 0])  # the positive's stays
    expected = np.where(drawn >= 0, drawn / 7.0, np.nan).astype(np.float32)
    np.testing.assert_array_equal(drawn_scores[:, 1:], expected)
    assert draw_negatives(column, mined=6, keep=6, seed=4, teacher_scores=scores)[1] is scores


def test_a_ranks_share_carries_the_teachers_scores_of_its_rows_beside_their_negatives(tmp_path):
    cfg = load_config(None, ["task=pairs", "data.path=rows.jsonl", "train.batch_size=4"])
    rows = 10
    triplets = Triplets(np.arange(rows), np.arange(rows) + 100, np.full(rows, -1))
    mined = 200 + np.arange(rows)[:, None]
    scores = np.stack([np.arange(rows) + 0.5, -np.arange(rows) - 0.25], axis=1).astype(np.float32)
    uri = write_mined(str(tmp_path), "v1-negatives.npz", negatives=mined, teacher_scores=scores)
    lengths = np.full(300, 5, dtype=np.int32)
    seen = []
    for share in make_shares(PlanSource(1, seed=3, negatives=uri), cfg, lengths, triplets, world=2):
        np.testing.assert_array_equal(share.teacher_scores, scores[share.rows])
        for index in range(share.num_batches):
            local, _ = share.local(index)
            np.testing.assert_array_equal(share.local_teacher_scores(index), scores[local])
            seen += local.tolist()
    assert sorted(seen) == list(range(rows))
