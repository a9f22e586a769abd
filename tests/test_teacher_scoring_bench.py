"""bench.teacher_scoring's pairs: each anchor beside another row's positive, as a mined negative."""

from __future__ import annotations

import pytest

from bench.teacher_scoring import read_pairs


def test_each_anchor_is_paired_with_another_rows_positive(tmp_path):
    rows = [f"anchor {i}\tpositive {i}\t1" for i in range(5)]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join([*rows, "\tempty anchor"]) + "\n", encoding="utf-8")
    anchors, candidates = read_pairs(path, 12)
    assert len(anchors) == len(candidates) == 12
    assert anchors[:5] == [f"anchor {i}" for i in range(5)] and anchors[5] == "anchor 0"  # cycled
    for anchor, candidate in zip(anchors, candidates, strict=True):
        assert candidate.startswith("positive ") and candidate.split()[1] != anchor.split()[1]
    # A line that is not a pair stops the bench, naming it, as every pair file the benches read.
    path.write_text("\n".join([*rows, "no tab here"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="pairs.tsv:6: 1 tab-separated columns"):
        read_pairs(path, 12)
