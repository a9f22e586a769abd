"""The teacher in a pairs refresh: its score column against the teacher scoring each pair on its
own, and its denoising against a per-row reading of the rule."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mining.teacher_scores import denoised, denoised_in_steps, scored_by_teacher, teacher_scores
from pipeline.model.teacher import Teacher, TeacherSettings

TEXTS = [
    f"sentence number {i} about {topic}" for i, topic in enumerate(["cats", "dogs", "rain", "stocks"] * 5)
]


@pytest.mark.parametrize("kind", ["bi_encoder", "cross_encoder"])
def test_the_column_is_the_teachers_score_of_each_pair_and_nan_where_a_slot_is_empty(
    tiny_model_dir, tiny_cross_encoder_dir, kind
):
    folder = tiny_model_dir if kind == "bi_encoder" else tiny_cross_encoder_dir
    teacher = Teacher(TeacherSettings(str(folder), max_seq_len=16, batch_size=4), device="cpu")
    assert teacher.settings.kind == kind
    asked = []

    def texts_at(positions: np.ndarray) -> list[str]:
        asked.append(positions.copy())
        return [TEXTS[p] for p in positions]

    anchors = np.array([0, 1, 0, 7])  # anchor 0 twice: its pair with 3 is scored once
    positives = np.array([3, 2, 3, 8])
    negatives = np.array([[5, 6], [-1, -1], [5, 9], [10, -1]])
    column, pairs = teacher_scores(
        teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives
    )
    assert pairs == 7  # (0, 3) and (0, 5) once each, (0, 6), (0, 9), (1, 2), (7, 8), (7, 10)
    # A bi-encoder encodes each of the 10 distinct texts once; a cross-encoder scores each pair.
    assert teacher.computed() == ((10, "texts") if kind == "bi_encoder" else (7, "pairs"))
    assert column.shape == (4, 3) and column.dtype == np.float32
    # Each distinct text is fetched once, in one call.
    (positions,) = asked
    assert sorted(positions.tolist()) == sorted({0, 1, 7, 3, 2, 8, 5, 6, 9, 10})
    for i in range(4):
        for j, candidate in enumerate([positives[i], *negatives[i]]):
            if candidate < 0:
                assert np.isnan(column[i, j])
            else:
                alone = Teacher(teacher.settings, device="cpu").score(
                    [TEXTS[anchors[i]]], [TEXTS[candidate]]
                )[0]
                assert column[i, j] == pytest.approx(alone, abs=1e-5)


def test_denoising_drops_what_the_teacher_scores_near_the_positive_and_refills_from_deeper_ranks():
    rng = np.random.default_rng(0)
    rows, mined, margin = 200, 6, 0.1
    negatives = rng.integers(0, 1000, size=(rows, mined + 1))  # 6 mined, then a random one
    negatives[rng.random((rows, mined + 1)) < 0.2] = -1
    scores = rng.uniform(-1, 1, size=(rows, 1 + mined + 1)).astype(np.float32)
    scores[:, 1:][negatives < 0] = np.nan
    kept, kept_scores, dropped = denoised(negatives, scores, margin=margin, mined=mined, keep=3)
    assert kept.shape == (rows, 3 + 1) and kept_scores.shape == (rows, 1 + 3 + 1)
    total = 0
    for i in range(rows):
        # By the rule, row by row: mined survivors in mined order, the first 3 kept.
        survivors = [
            (negatives[i, j], scores[i, 1 + j])
            for j in range(mined)
            if negatives[i, j] >= 0 and not scores[i, 1 + j] >= scores[i, 0] - margin
        ]
        total += sum(1 for j in range(mined) if negatives[i, j] >= 0) - len(survivors)
        expected = survivors[:3] + [(-1, np.nan)] * (3 - len(survivors[:3]))
        assert kept[i, :3].tolist() == [n for n, _ in expected]
        np.testing.assert_array_equal(
            kept_scores[i, 1:4], np.array([s for _, s in expected], dtype=np.float32)
        )
        # The positive's score and the random negative ride along untouched.
        assert kept[i, 3] == negatives[i, mined] and kept_scores[i, 0] == scores[i, 0]
        np.testing.assert_array_equal(kept_scores[i, 4], scores[i, 1 + mined])
    assert len(dropped) == total > 0
    # The scores of those dropped, each at or above its row's positive less the margin.
    assert np.isin(dropped, scores[:, 1 : 1 + mined]).all() and dropped.min() >= scores[:, 0].min() - margin


def test_scoring_in_steps_keeps_what_scoring_the_whole_window_keeps_and_scores_fewer_pairs(tiny_model_dir):
    teacher = Teacher(TeacherSettings(str(tiny_model_dir), max_seq_len=16, batch_size=4), device="cpu")
    rng = np.random.default_rng(1)
    rows, mined, keep = 60, 8, 2
    anchors, positives = rng.integers(0, len(TEXTS), rows), rng.integers(0, len(TEXTS), rows)
    negatives = rng.integers(0, len(TEXTS), size=(rows, mined + 1))  # 8 mined, then a random one
    negatives[rng.random(negatives.shape) < 0.15] = -1

    def texts_at(positions: np.ndarray) -> list[str]:
        return [TEXTS[p] for p in positions]

    whole, whole_pairs = teacher_scores(
        teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives
    )
    # A margin that drops about a third of the mined negatives, far from any row's gap.
    gaps = np.unique((whole[:, :1] - whole[:, 1 : 1 + mined])[negatives[:, :mined] >= 0])
    lo = len(gaps) // 4
    widest = lo + int(np.argmax(np.diff(gaps[lo : len(gaps) // 2 + 1])))
    margin = float(gaps[widest] + gaps[widest + 1]) / 2
    expected, expected_scores, dropped_in_window = denoised(
        negatives, whole, margin=margin, mined=mined, keep=keep
    )
    kept, kept_scores, dropped, pairs = denoised_in_steps(
        teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives,
        margin=margin, mined=mined, keep=keep,
    )  # fmt: skip
    np.testing.assert_array_equal(kept, expected)
    np.testing.assert_allclose(kept_scores, expected_scores, atol=1e-5)
    # Some rows were refilled from deeper ranks (a step past their first two), and the window's
    # tail of the rows that needed none was never scored.
    first = whole[:, 1 : 1 + keep]
    refilled = ((first >= whole[:, :1] - margin).any(axis=1) & (kept[:, :keep] >= 0).all(axis=1)).sum()
    assert refilled > 0 and 0 < len(dropped) < len(dropped_in_window)
    assert pairs < whole_pairs
    # The refresh's step draws the positives', the kept and the dropped negatives' scores apart.
    _, _, metrics, histogram = scored_by_teacher(
        teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives,
        denoise_margin=margin, mined=mined, keep=keep, version=1,
    )  # fmt: skip
    np.testing.assert_allclose(histogram["positives"], kept_scores[:, 0], atol=1e-5)
    # Every text was encoded by the scoring above: the cache answers this step's every pair.
    assert metrics["mining/teacher_pairs"] == pairs and metrics["mining/teacher_computed"] == 0
    np.testing.assert_allclose(
        np.sort(histogram["negatives kept"]), np.sort(kept_scores[:, 1:][kept >= 0]), atol=1e-5
    )
    assert (
        len(histogram["negatives dropped as likely positives"])
        == metrics["mining/teacher_denoised"]
        == len(dropped)
    )
