"""Pair inputs on a real local Ray: headerless pair files read as written, labels (label-1 rows
train, label-0 rows are given negatives), a separate candidate pool, and the [UNK] share of
the tokenized corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import ray

from pipeline.config.data_section import DataSection
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError, DataError
from pipeline.data.input_checks import check_corpus_columns
from pipeline.data.pair_labels import round_robin_negatives
from pipeline.data.pairs import index_pairs, load_pairs, pair_texts, read_pairs
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.tokenize import TokenizeStats, count_unknown, tokenize_texts
from pipeline.data.triplets import index_triplets

# Quotes anywhere in a field, as in the Twitter URL corpus: quoting is off, a field runs to the tab.
QUOTED = [
    ('"breaking" news : the cat is "back"', 'the cat is back , says "mayor"', "1"),
    ('"breaking" news : the cat is "back"', '" wow', "0"),
    ('he said "no', 'no" he said', "1"),
]


def _tsv(path: Path, rows: list[tuple[str, ...]]) -> Path:
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _pairs_tsv(path: Path, **keys) -> DataSection:
    return DataSection(path=str(path), format="pairs_tsv", **keys)


# A: three positives, two label-0 texts (one listed twice, one a positive of A too: that
# one is no negative of A); B: one positive, no label-0 row; C: only label-0 rows.
LABELLED = [
    ("a", "a1", "1"),
    ("a", "n1", "0"),
    ("b", "b1", "1"),
    ("a", "a2", "1"),
    ("a", "n2", "0"),
    ("a", "n1", "0"),
    ("a", "a1", "0"),
    ("c", "n3", "0"),
    ("a", "a3", "1"),
]


def _texts(rows):
    """:func:`pair_texts` of ``rows`` as the offline job reads them: indexed, then gathered."""
    return pair_texts(rows, *index_pairs(rows))


def test_headerless_pairs_read_exactly(ray_local, tmp_path):
    rows = load_pairs(_pairs_tsv(_tsv(tmp_path / "q.tsv", QUOTED)))
    assert _texts(rows)[0] == [QUOTED[0][0], QUOTED[2][0]]
    assert _texts(rows)[1] == [QUOTED[0][1], QUOTED[2][1]]
    assert rows.rows_read == 3 and rows.negative_rows == 1
    assert _texts(rows)[2] == ['" wow', ""]  # a field may start with a quote
    two = load_pairs(_pairs_tsv(_tsv(tmp_path / "two.tsv", [r[:2] for r in QUOTED])))
    assert _texts(two)[0] == [r[0] for r in QUOTED] and _texts(two)[1] == [r[1] for r in QUOTED]
    assert two.negatives is None and two.negative_rows == 0  # no labels: every row is a pair


def test_labels_give_rows_and_round_robin_negatives(ray_local, tmp_path):
    rows = load_pairs(_pairs_tsv(_tsv(tmp_path / "l.tsv", LABELLED)))
    assert list(zip(_texts(rows)[0], _texts(rows)[1], strict=True)) == [
        ("a", "a1"),
        ("b", "b1"),
        ("a", "a2"),
        ("a", "a3"),
    ]
    assert _texts(rows)[2] == ["n1", "", "n2", "n1"]  # a's 1st, 2nd, 3rd row: n1, n2, n1 again
    assert rows.given == 3 and rows.negative_rows == 5 and rows.rows_read == 9
    assert rows.describe() == (
        "4 (anchor, positive) rows of 9 read (5 labelled 0, 0 with an empty field dropped), 3 with a given negative"
    )
    texts_in_store, triplets = index_pairs(rows)
    texts = texts_in_store.gather().column("text").to_pylist()
    assert [texts[i] if i >= 0 else None for i in triplets.negative] == ["n1", None, "n2", "n1"]
    assert "n3" not in texts  # c has no positive: its label-0 text is nobody's negative
    assert triplets.pool is None
    assert sorted(texts[i] for i in triplets.candidate_pool()) == ["a1", "a2", "a3", "b1"]
    # data.max_rows: the first (anchor, positive) rows, negatives assigned as over the whole file
    cut = load_pairs(_pairs_tsv(tmp_path / "l.tsv", max_rows=3))
    assert (
        _texts(cut)[0] == ["a", "b", "a"] and _texts(cut)[2] == ["n1", "", "n2"] and cut.beyond_max_rows == 1
    )
    # the same file with a header, labels as numbers (csv) or strings (jsonl)
    csv = tmp_path / "l.csv"
    csv.write_text("q,d,y\n" + "".join(f"{a},{t},{y}\n" for a, t, y in LABELLED))
    jsonl = tmp_path / "l.jsonl"
    jsonl.write_text("".join(json.dumps({"q": a, "d": t, "y": y}) + "\n" for a, t, y in LABELLED))
    for path in (csv, jsonl):
        section = DataSection(path=str(path), anchor_column="q", positive_column="d", label_column="y")
        assert read_pairs(section) == (
            _texts(rows)[0],
            _texts(rows)[1],
            _texts(rows)[2],
            9,
        )


def test_given_negatives_off_leaves_label_0_rows_out(ray_local, tmp_path):
    rows = load_pairs(_pairs_tsv(_tsv(tmp_path / "l.tsv", LABELLED), given_negatives=False))
    assert _texts(rows)[0] == ["a", "b", "a", "a"] and rows.negatives is None and rows.given == 0
    texts_in_store, triplets = index_pairs(rows)
    assert sorted(texts_in_store.gather().column("text").to_pylist()) == ["a", "a1", "a2", "a3", "b", "b1"]
    assert (triplets.negative == -1).all()
    column = tmp_path / "n.csv"
    column.write_text("anchor,positive,negative\na,a1,n1\nb,b1,n2\n")
    kept = load_pairs(DataSection(path=str(column), negative_column="negative"))
    assert _texts(kept)[2] == ["n1", "n2"]
    off = load_pairs(DataSection(path=str(column), negative_column="negative", given_negatives=False))
    assert off.negatives is None


def test_round_robin_without_ray():
    """Over text ids: anchor 1's rows get its label-0 texts 20, 21, 20 in turn; anchor 2 has none."""
    negatives = round_robin_negatives(
        np.array([1, 2, 1, 1]), np.array([10, 11, 12, 13]), np.array([1, 1, 3, 1]), np.array([20, 21, 22, 12])
    )
    assert negatives.tolist() == [20, -1, 21, 20]  # 12 is a positive of anchor 1: not its negative


def _one_line_error(call) -> str:
    with pytest.raises(DataError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_pair_files_fail_with_one_line(ray_local, tmp_path):
    bad_label = _tsv(tmp_path / "bad.tsv", [("a", "b", "1"), ("a", "c", "2")])
    assert _one_line_error(lambda: load_pairs(_pairs_tsv(bad_label))) == (
        f"data.path: {bad_label}, row 2: label '2' is neither 1 (a pair to train on) nor 0 "
        "(a given negative of its anchor)"
    )
    csv = tmp_path / "bad.csv"
    csv.write_text("anchor,positive,label\na,b,1\na,c,yes\n")
    assert _one_line_error(lambda: load_pairs(DataSection(path=str(csv), label_column="label"))).startswith(
        f"data.label_column: {csv}, row 2: label 'yes' is neither 1"
    )
    no_positive = _tsv(tmp_path / "neg.tsv", [("a", "b", "0"), ("a", "c", "0")])
    assert _one_line_error(lambda: load_pairs(_pairs_tsv(no_positive))) == (
        f"data.path: {no_positive} has no row labelled 1 (a pair to train on) among its 2 rows"
    )
    missing = DataSection(path=str(csv), label_column="score")
    expected = f"data.label_column: column 'score' not in {csv} (columns: anchor, positive, label)"
    assert _one_line_error(lambda: check_corpus_columns(missing, pairs=True)) == expected
    assert _one_line_error(lambda: load_pairs(missing)) == expected
    short_row = tmp_path / "short.tsv"
    short_row.write_text('a\t"b\t1\nc\td\t0\ne\tf\n')
    message = _one_line_error(lambda: load_pairs(_pairs_tsv(short_row)))
    assert message.startswith(f"data.path: cannot read {short_row} as pairs_tsv: ")
    assert "Row #3: Expected 3 columns, got 2" in message
    wide = _tsv(tmp_path / "wide.tsv", [("a", "b", "1", "x")])
    assert _one_line_error(lambda: check_corpus_columns(_pairs_tsv(wide), pairs=True)) == (
        f"data.path: {wide} has 4 tab-separated fields on its first line; pairs_tsv reads 2 "
        "(sentence1, sentence2) or 3 (sentence1, sentence2, label), unquoted"
    )
    assert "data.format: pairs_tsv holds" in _one_line_error(
        lambda: check_corpus_columns(_pairs_tsv(wide), pairs=False)
    )


def test_pool_path_and_column_checked_before_ray(tmp_path):
    """No Ray: the train job's input check names data.pool."""
    from pipeline.jobs.train_job import check_train_inputs

    pairs = _tsv(tmp_path / "l.tsv", LABELLED)
    keys = [
        f"data.path={pairs}",
        "data.format=pairs_tsv",
        "task=pairs",
        "mining.refresh=never",
    ]
    missing = load_config(None, [*keys, f"data.pool={tmp_path}/corpus.txt"])
    assert (
        _one_line_error(lambda: check_train_inputs(missing))
        == f"data.pool: {tmp_path}/corpus.txt does not exist"
    )
    (tmp_path / "corpus.csv").write_text("sentence\nx\n")
    no_column = load_config(None, [*keys, f"data.pool={tmp_path}/corpus.csv"])
    assert _one_line_error(lambda: check_train_inputs(no_column)) == (
        f"data.text_column: column 'text' not in {tmp_path}/corpus.csv (columns: sentence)"
    )
    unsupervised = load_config(None, [f"data.path={tmp_path}/corpus.csv", f"data.pool={tmp_path}/corpus.csv"])
    assert _one_line_error(lambda: check_train_inputs(unsupervised)).startswith(
        "data.pool: a candidate pool is for"
    )
    with pytest.raises(ConfigError, match="data.negative_column must be unset with data.label_column"):
        load_config(None, ["data.label_column=y", "data.negative_column=n"])


def test_pool_texts_join_the_table_once(ray_local, tmp_path):
    pairs = _tsv(tmp_path / "l.tsv", LABELLED)
    pool_txt = tmp_path / "pool.txt"
    pool_txt.write_text("z1\n  a1 \nz2\n\nz1\na\n")  # a positive, an anchor, a duplicate, an empty line
    rows = load_pairs(_pairs_tsv(pairs, pool=str(pool_txt)))
    assert _texts(rows)[3] == ["a", "a1", "z1", "z2"]
    texts_in_store, triplets = index_pairs(rows)
    texts = texts_in_store.gather().column("text").to_pylist()
    assert len(texts) == len(set(texts))  # every text once, pool texts among anchors and positives
    assert set(texts) == {"a", "b", "a1", "a2", "a3", "b1", "n1", "n2", "z1", "z2"}
    assert sorted(texts[i] for i in triplets.pool) == ["a", "a1", "a2", "a3", "b1", "z1", "z2"]
    assert np.array_equal(triplets.candidate_pool(), np.sort(triplets.pool))
    # a csv pool's data.text_column, and a pairs_tsv pool: every sentence2
    (tmp_path / "pool.csv").write_text("doc\nz3\na2\n")
    csv_pool = load_pairs(_pairs_tsv(pairs, pool=str(tmp_path / "pool.csv"), text_column="doc"))
    assert _texts(csv_pool)[3] == ["a2", "z3"]
    tsv_pool = load_pairs(_pairs_tsv(pairs, pool=str(pairs), pool_format="pairs_tsv"))
    assert _texts(tsv_pool)[3] == ["a1", "a2", "a3", "b1", "n1", "n2", "n3"]
    assert "n3" in index_pairs(tsv_pool)[0].gather().column("text").to_pylist()  # a candidate, not a negative


def test_index_triplets_without_pool_keeps_its_positional_call(paraphrase_pairs):
    anchors, positives = paraphrase_pairs
    table, triplets = index_triplets(anchors, positives, None)
    assert triplets.pool is None and table.num_rows == len(set(anchors) | set(positives))


class _NoUnkTokenizer:
    unk_token_id = None
    all_special_ids = [0, 1]


def test_unk_share_without_an_unknown_token():
    import pyarrow as pa

    unk, words = count_unknown(pa.array([[0, 5, 1]], pa.list_(pa.int32())), _NoUnkTokenizer())
    assert unk.tolist() == [0] and words.tolist() == [0]
    stats = TokenizeStats(sentences=1, truncated=0, max_seq_len=32)
    assert stats.unk_share is None and stats.unk_warning() is None


def test_unk_share_counts_what_the_tokenizer_cannot_read(
    ray_local, tmp_path, tiny_model_dir, paraphrase_corpus
):
    """A tiny WordPiece tokenizer trained on Latin-script sentences meets Greek ones: the share
    of [UNK] among non-special tokens matches a count from the tokenizer itself, and the job
    warns with one line and logs the data/unk_share param."""
    import pyarrow as pa

    from pipeline.data.utf8 import stable_row_id
    from pipeline.jobs.train_inputs import TrainingData, describe_corpus, tokenize_inputs
    from pipeline.model.folders import load_tokenizer

    greek = ["καλημέρα κόσμε", "η γάτα κάθεται στο χαλί", "ο σκύλος γαβγίζει τη νύχτα"]
    texts = list(dict.fromkeys(paraphrase_corpus[0][:10])) + greek
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    order = np.argsort(ids)
    corpus = DistinctTexts(ids[order], [ray.put(pa.table({"id": ids, "text": texts}))])
    tokenizer = load_tokenizer(tiny_model_dir)
    section = DataSection(max_seq_len=64)
    _, stats = tokenize_texts(corpus, tokenizer, section)
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    unk = sum(ids.count(tokenizer.unk_token_id) for ids in encoded)
    assert unk >= 11  # each Greek word is one [UNK]
    assert (stats.unk_tokens, stats.word_tokens) == (unk, sum(map(len, encoded)))
    assert stats.unk_share == pytest.approx(unk / sum(map(len, encoded))) and stats.unk_share > 0.01

    class Tracked:
        params: dict = {}

        def set_tags(self, tags):
            pass

        def log_params(self, params):
            self.params.update(params)

    cfg = load_config(None, [f"model.name_or_path={tiny_model_dir}", "data.max_seq_len=64"])
    lines: list[str] = []
    tracked = Tracked()
    data = TrainingData(corpus, None, len(texts), f"{len(texts)} sentences")
    inputs = tokenize_inputs(cfg, data, tmp_path, tracked, lines.append)
    assert float(tracked.params["data/unk_share"]) == pytest.approx(stats.unk_share, rel=1e-3)
    warnings = [line for line in lines if "[UNK]" in line and "warning" in line]
    assert warnings == [
        f"[data] warning: {stats.unk_share:.1%} of the corpus' tokens are [UNK] ({unk} of "
        f"{stats.word_tokens}): the tokenizer probably does not cover this language or script; "
        "use a model whose vocabulary does"
    ]
    assert describe_corpus(data, inputs) == f"{len(texts)} sentences; {stats.unk_share:.2%} of tokens [UNK]"
