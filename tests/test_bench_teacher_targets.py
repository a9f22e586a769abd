"""bench.teacher_targets reads a refresh's written column and summarises the KL target the
student is pulled towards, checked against a softmax worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.teacher_targets import main, target_summary
from pipeline.training.plan_source import write_mined


def test_the_kl_targets_summary_is_the_softmax_over_the_present_candidates() -> None:
    scores = np.array([[0.9, 0.8, 0.5, np.nan], [0.6, 0.7, np.nan, np.nan], [0.7, np.nan, np.nan, np.nan]])
    present = np.array([[True, True, False], [True, False, False], [False, False, False]])
    got = target_summary(scores, present, temperature=0.1)
    row0 = np.exp(np.array([0.9, 0.8, 0.5]) / 0.1)
    row0 /= row0.sum()
    row1_positive = 1 / (1 + math.exp((0.7 - 0.6) / 0.1))
    assert got["rows"] == 2  # the third row has no negative: no target
    assert got["p(positive)"] == pytest.approx((row0[0] + row1_positive) / 2)
    assert got["rows with p(positive) > 0.95"] == 0.0
    assert got["rows ranking a negative first"] == 0.5  # row 1's negative outscores its positive
    rest = row0[1:] / row0[1:].sum()
    assert got["negatives' entropy (0-1)"] == pytest.approx(-(rest * np.log(rest)).sum() / math.log(2))


def test_it_reads_the_column_a_refresh_wrote_and_refuses_one_without_scores(tmp_path, capsys) -> None:
    negatives = np.array([[3, 4], [5, -1]], dtype=np.int32)
    scores = np.array([[0.9, 0.2, 0.1], [0.8, 0.85, np.nan]], dtype=np.float32)
    uri = write_mined(str(tmp_path), "v1-negatives.npz", negatives=negatives, teacher_scores=scores)
    main([uri, "--temperatures", "0.05"])
    out = capsys.readouterr().out
    assert "2 rows, 2 negatives a row" in out and "| 0.05 | 2 |" in out
    bare = write_mined(str(tmp_path), "v2-negatives.npz", negatives=negatives)
    with pytest.raises(SystemExit, match="no teacher_scores"):
        main([bare])
