"""bench.pair_folds: every row lands in exactly one fold, an anchor's rows all in the same one,
and the split is the MD5 rule the docs name (computed here independently)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from bench.pair_folds import split_pairs


def test_folds_partition_the_rows_and_keep_each_anchor_together(tmp_path: Path) -> None:
    lines = []
    for a in range(40):
        for p in range(3):
            label = "1" if p == 0 else "0"
            anchor = f"Headline {a}" if p != 2 else f"  headline {a} "  # same anchor, other case/space
            lines.append(f"{anchor}\ttweet {a}-{p}\t{label}\n")
    source = tmp_path / "pairs.tsv"
    source.write_text("".join(lines), encoding="utf-8")

    counts = split_pairs(source, 3, tmp_path / "folds")

    folds = [
        (tmp_path / "folds" / f"fold{i}.tsv").read_text(encoding="utf-8").splitlines(True) for i in range(3)
    ]
    assert sorted(line for fold in folds for line in fold) == sorted(lines)
    assert [c["rows"] for c in counts] == [len(f) for f in folds]
    assert sum(c["positives"] for c in counts) == 40
    for i, fold in enumerate(folds):
        for line in fold:
            anchor = line.split("\t")[0]
            assert int(hashlib.md5(anchor.strip().lower().encode()).hexdigest(), 16) % 3 == i
    assert all(folds), "40 anchors over 3 folds leave none empty"
