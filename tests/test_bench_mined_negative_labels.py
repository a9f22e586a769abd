"""bench.mined_negative_labels counts what the mined negatives of a labelled pair file are."""

import pyarrow as pa
import pyarrow.parquet as pq

from bench.mined_negative_labels import main, negative_labels


def test_negatives_are_counted_as_own_label_0_or_another_anchors_label_1(tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "Storm hits coast\tstorm batters the coast\t1\n"
        "Storm hits coast\tstorm photos, unrelated\t0\n"
        "Markets fall\tstocks slide on Monday\t1\n"
        "Markets fall\tmarket closed for holiday\t0\n",
        encoding="utf-8",
    )
    mined = tmp_path / "mined.parquet"
    pq.write_table(
        pa.table({
            "anchor": ["Storm hits coast", "storm hits  coast!", "Markets fall", "Markets fall"],
            "positive": ["storm batters the coast"] * 2 + ["stocks slide on Monday"] * 2,
            # own label-0 (case and punctuation differ), another anchor's label-1, neither, none
            "negative_1": ["Storm photos unrelated", "Stocks slide on Monday.", "market closed today", None],
        }),
        mined,
    )  # fmt: skip
    main(["--mined", str(mined), "--pairs", str(pairs)])
    assert capsys.readouterr().out.strip() == (
        "3 mined negatives: 1 (33.3%) are a label-0 text of their own anchor, 1 (33.3%) a label-1 text of another anchor"
    )
    # A label-1 text of the row's own anchor is not "another anchor's".
    counts = negative_labels(
        [("Markets fall", "stocks slide on monday")], [("Markets fall", "stocks slide on Monday", 1)]
    )
    assert (counts.rows, counts.own_label_0, counts.other_label_1) == (1, 0, 0)
