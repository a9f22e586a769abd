"""The corpus stage on a real local Ray: every reader, cleaning, dedup, ids, tokenization."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from pipeline.config.data_section import DataSection
from pipeline.core.errors import DataError
from pipeline.data.columns import corpus_columns, require_columns
from pipeline.data.corpus import load_clean_corpus
from pipeline.data.formats import infer_format
from pipeline.data.input_checks import check_corpus_columns, check_corpus_path
from pipeline.data.normalize import normalize_text
from pipeline.data.pairs import read_pairs
from pipeline.data.readers import read_dataset
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.tokenize import tokenize_texts
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.utf8 import stable_row_id
from pipeline.model.folders import load_tokenizer

SENTENCES = [
    "A cat sat on the mat.",
    "  Dogs bark at night. ",
    "",
    "A cat sat on the mat.",
    "Birds fly south.",
    "   ",
]
CLEAN = {"A cat sat on the mat.", "Dogs bark at night.", "Birds fly south."}


def _write(tmp_path, fmt):
    if fmt == "text":
        path = tmp_path / "corpus.txt"
        path.write_text("\n".join(SENTENCES) + "\n")
    elif fmt == "csv":
        path = tmp_path / "corpus.csv"
        rows = ["id,sentence"] + [f'{i},"{s}"' for i, s in enumerate(SENTENCES)]
        path.write_text("\n".join(rows) + "\n")
    elif fmt == "tsv":
        path = tmp_path / "corpus.tsv"
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{i}\n" for i, s in enumerate(SENTENCES)))
    elif fmt == "jsonl":
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({"sentence": s, "n": i}) + "\n" for i, s in enumerate(SENTENCES)))
    else:
        path = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"sentence": SENTENCES, "n": list(range(len(SENTENCES)))}), path)
    return path


@pytest.mark.parametrize("fmt", ["text", "csv", "tsv", "jsonl", "parquet"])
def test_readers_clean_and_dedup(ray_local, tmp_path, fmt):
    path = _write(tmp_path, fmt)
    section = DataSection(path=str(path), text_column="sentence")
    texts, stats = load_clean_corpus(section)
    corpus = texts.gather()
    assert set(corpus.column("text").to_pylist()) == CLEAN
    # 64-bit offsets: the gathered texts of a corpus past 2 GiB of text stay one array.
    assert corpus.schema.field("text").type == pa.large_string()
    assert stats.sentences == 3 and stats.duplicates_dropped == 1
    assert stats.rows_read - stats.empty_dropped - stats.duplicates_dropped == 3
    assert stats.rows_read == 6 and stats.empty_dropped == 2
    ids = corpus.column("id").to_pylist()
    assert ids == sorted(ids) == texts.ids.tolist()
    assert ids == sorted(stable_row_id(t) for t in CLEAN)  # content hash: same text, same id anywhere


def test_missing_column_and_path_are_named(ray_local, tmp_path):
    path = _write(tmp_path, "jsonl")
    with pytest.raises(DataError, match="data.text_column: column 'text' not in"):
        load_clean_corpus(DataSection(path=str(path)))
    with pytest.raises(DataError, match="does not exist"):
        check_corpus_path(str(tmp_path / "nope.txt"))
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    with pytest.raises(DataError, match="no non-empty sentences"):
        load_clean_corpus(DataSection(path=str(tmp_path / "blank.txt")))
    with pytest.raises(DataError, match="data.format"):
        load_clean_corpus(DataSection(path=str(tmp_path / "corpus.unknown")))


def test_tokenize_matches_tokenizer_and_batches_pad(
    ray_local, tmp_path, tiny_model_dir, paraphrase_corpus, monkeypatch
):
    monkeypatch.setattr("pipeline.data.tokenize.ROWS_PER_BATCH", 50)  # many blocks, done out of order
    texts, _ = paraphrase_corpus
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts))
    section = DataSection(path=str(path), max_seq_len=8)
    distinct, _ = load_clean_corpus(section)
    corpus = distinct.gather()
    tokenizer = load_tokenizer(tiny_model_dir)
    blocks, _ = tokenize_texts(distinct, tokenizer, section)
    table = blocks.table()  # what a worker assembles: sorted by id, whatever order the blocks came in
    assert table.column("id").to_pylist() == corpus.column("id").to_pylist()
    expected = tokenizer(corpus.column("text").to_pylist(), truncation=True, max_length=8)["input_ids"]
    assert table.column("input_ids").to_pylist() == expected
    keys = [normalize_text(t) for t in corpus.column("text").to_pylist()]
    same = [[a == b for b in keys] for a in keys]  # the miner's "same sentence", from keys alone
    text_keys = table.column("text_key").to_pylist()
    assert [[a == b for b in text_keys] for a in text_keys] == same
    assert max(len(x) for x in expected) == 8  # truncation happened
    view = TokenizedCorpus(table, tokenizer.pad_token_id)
    rows = np.array([5, 0, 17])
    ids, mask = view.batch(rows)
    for r, (row_ids, row_mask) in zip(rows, zip(ids, mask, strict=True), strict=True):
        n = int(row_mask.sum())
        assert row_ids[:n].tolist() == expected[r] and (row_ids[n:] == tokenizer.pad_token_id).all()


def test_max_rows_sample_is_the_one_the_recipe_peer_trains_on(tmp_path, ray_local, paraphrase_corpus):
    """data.max_rows keeps a fixed sample (the first distinct sentences by content hash), and the
    sentence-transformers side of the recipes picks exactly the same sentences."""

    from bench.st_mnrl_recipe import training_rows

    texts, _ = paraphrase_corpus
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts[:500] + texts[:50] + ["", "  "]) + "\n")
    distinct, stats = load_clean_corpus(DataSection(path=str(path), max_rows=120))
    corpus = distinct.gather()
    assert corpus.num_rows == 120 and stats.beyond_max_rows == 500 - 120 and stats.duplicates_dropped == 50
    expected = sorted(texts[:500], key=stable_row_id)[:120]
    assert corpus.column("text").to_pylist() == expected

    rows = training_rows(str(path), 120)
    assert rows["anchor"] == expected and rows["positive"] == expected


def _column_case(tmp_path: Path, case: str) -> tuple[DataSection, bool]:
    """A corpus for the column check and how the job reads it: ``(section, pairs)``."""
    if case == "csv":
        path = tmp_path / "corpus.csv"
        path.write_text("sentence,label\na cat,1\n")
    elif case == "tsv, quoted header":  # the quoted tab is inside a name, not between two
        path = tmp_path / "corpus.tsv"
        path.write_text('sentence\t"te\txt"\na cat\t1\n')
    elif case == "csv.gz":
        path = tmp_path / "corpus.csv.gz"
        path.write_bytes(gzip.compress(b"sentence,label\na cat,1\n"))
    elif case == "jsonl":
        path = tmp_path / "corpus.jsonl"
        path.write_text("\n" + "".join(json.dumps({"sentence": f"s {i}", "n": i}) + "\n" for i in range(3)))
    elif case == "parquet":
        path = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"sentence": ["a cat"], "label": [1]}), path)
    elif case == "folder":  # hidden and marker files are skipped, as Ray Data skips them
        path = tmp_path / "shards"
        (path / "sub").mkdir(parents=True)
        (path / ".hidden.csv").write_text("text\nx\n")
        (path / "_SUCCESS").write_text("text\n")
        (path / "sub/part-0.csv").write_text("sentence,label\na cat,1\n")
        (path / "sub/part-1.csv").write_text("sentence,label\na dog,2\n")
        return DataSection(path=str(path), format="csv"), False
    elif case == "pairs csv without the positive":
        path = tmp_path / "pairs.csv"
        path.write_text("anchor,answer\na cat,a kitten\n")
        return DataSection(path=str(path)), True
    elif case == "pairs jsonl without the negative":
        path = tmp_path / "pairs.jsonl"
        path.write_text(json.dumps({"anchor": "a cat", "positive": "a kitten", "hard": "a car"}) + "\n")
        return DataSection(path=str(path), negative_column="negative"), True
    elif case == "jsonl, key from line 2":  # fine: a key that first shows up late still counts
        path = tmp_path / "late.jsonl"
        rows = [{"sentence": "a"}, *({"sentence": f"s {i}", "text": f"t {i}"} for i in range(3))]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:  # "jsonl, key after the first MiB"
        path = tmp_path / "very-late.jsonl"
        head = "".join(json.dumps({"n": i}) + "\n" for i in range(120_000))
        path.write_text(head + json.dumps({"n": -1, "text": "a late sentence"}) + "\n")
    return DataSection(path=str(path)), False


COLUMN_CASES = {
    # case: the error both the check before Ray and the Ray Data reader raise, or None (both pass)
    "csv": "data.text_column: column 'text' not in {path} (columns: sentence, label)",
    "tsv, quoted header": "data.text_column: column 'text' not in {path} (columns: sentence, te\txt)",
    "csv.gz": "data.text_column: column 'text' not in {path} (columns: sentence, label)",
    "jsonl": "data.text_column: column 'text' not in {path} (columns: sentence, n)",
    "parquet": "data.text_column: column 'text' not in {path} (columns: sentence, label)",
    "folder": "data.text_column: column 'text' not in {path} (columns: sentence, label)",
    "pairs csv without the positive": (
        "data.positive_column: column 'positive' not in {path} (columns: anchor, answer)"
    ),
    "pairs jsonl without the negative": (
        "data.negative_column: column 'negative' not in {path} (columns: anchor, positive, hard)"
    ),
    "jsonl, key from line 2": None,
    "jsonl, key after the first MiB": None,
}


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_missing_column_reads_the_same_before_and_inside_ray(ray_local, tmp_path, case):
    """The header check before Ray and the Ray Data reader agree: the same error line for a
    missing column, and neither rejects a corpus that has it (however late in the file)."""
    section, pairs = _column_case(tmp_path, case)
    expected = COLUMN_CASES[case]

    def read() -> None:
        if pairs:
            read_pairs(section)
        else:
            load_clean_corpus(section)

    if expected is None:
        check_corpus_columns(section, pairs=pairs)
        fmt = infer_format(section.path, section.format)
        require_columns(read_dataset(section.path, fmt), section.path, corpus_columns(section))
        return
    expected = expected.format(path=section.path)
    with pytest.raises(DataError) as early:
        check_corpus_columns(section, pairs=pairs)
    assert str(early.value) == expected
    with pytest.raises(DataError) as late:
        read()
    assert str(late.value) == expected


def test_column_check_leaves_what_it_cannot_tell_to_the_reader(tmp_path):
    """No Ray: text files, empty or malformed first files (alone or first in a folder) and
    hive-style folders (whose path adds columns) pass the check; the reader reports them in
    its own words."""
    (tmp_path / "corpus.txt").write_text("a cat\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "array.jsonl").write_text("[1, 2]\n")
    (tmp_path / "hive/lang=en").mkdir(parents=True)
    (tmp_path / "hive/lang=en/part-0.csv").write_text("sentence\na cat\n")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards/part-0.csv").write_text("")  # Ray's csv reader fails on it
    (tmp_path / "shards/part-1.csv").write_text("sentence\na cat\n")
    for path in ("corpus.txt", "empty.csv", "array.jsonl", "hive", "shards"):
        check_corpus_columns(
            DataSection(path=str(tmp_path / path), format="auto" if "." in path else "csv"), pairs=False
        )
    check_corpus_columns(DataSection(path=str(tmp_path / "corpus.txt")), pairs=True)  # sentences as pairs
    check_corpus_columns(DataSection(path=None), pairs=False)  # generated corpus
    with pytest.raises(DataError, match="data.format: cannot tell the format"):
        check_corpus_columns(DataSection(path=str(tmp_path / "hive")), pairs=False)


@pytest.mark.parametrize(
    ("sentences", "truncated", "hint"),
    [
        (1950, 499, "25.6% of sentences are longer"),  # Wikipedia at max_seq_len 32
        (100, 5, "5.0% of sentences are longer"),  # the threshold itself
        (205, 5, None),  # 2.4%: a few long lines, no hint
        (100, 0, None),
        (0, 0, None),
    ],
)
def test_tokenize_stats_suggest_a_longer_max_seq_len_when_many_are_cut(sentences, truncated, hint):
    from pipeline.data.tokenize import TokenizeStats

    text = TokenizeStats(sentences=sentences, truncated=truncated, max_seq_len=32).describe()
    counts = f"{sentences} sentences (max_seq_len 32; {truncated} truncated"
    if hint is None:
        assert text == counts + ")"
    else:
        assert text == f"{counts}: {hint}, consider raising data.max_seq_len)"


def test_a_dead_tokenizer_actor_fails_the_stage_at_once(ray_local):
    """The tokenizer pool runs with max_restarts=0: an actor whose process dies fails the
    stage with Ray's error. With Ray Data's default (restart and retry forever) this waits
    for ever."""
    import os
    import threading

    class DyingTokenizer:  # defined here so that Ray pickles it by value
        def __call__(self, texts, **kwargs):
            os._exit(1)  # the actor's process dies, as on a segfault or the OOM killer

    table = pa.table({"id": np.arange(20, dtype=np.int64), "text": [f"sentence {i}" for i in range(20)]})
    corpus = DistinctTexts(np.arange(20, dtype=np.int64), [ray.put(table)])
    outcome = {}

    def tokenize():
        try:
            tokenize_texts(corpus, DyingTokenizer(), DataSection())
        except Exception as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=tokenize, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "tokenization is still retrying a dead tokenizer actor after 120 s"
    assert "actor died" in str(outcome.get("error")).lower(), outcome


def test_progress_bars_are_on_only_with_debug_and_their_notice_is_silenced_without(ray_local):
    """Ray Data's progress bars are off unless the job runs with --debug; off, Ray Data's
    warning that they are off is dropped, and only that logger is quietened."""
    import logging

    from ray.data import DataContext

    from pipeline.config.loading import load_config
    from pipeline.runtime.cluster import init_ray

    progress = logging.getLogger("ray.data._internal.progress")
    assert not progress.isEnabledFor(logging.WARNING) and progress.isEnabledFor(logging.ERROR)
    assert not DataContext.get_current().enable_progress_bars
    assert logging.getLogger("ray.data").isEnabledFor(logging.WARNING)
    cfg = load_config(None, [])
    init_ray(cfg, debug=True)  # joins the running Ray
    try:
        assert progress.isEnabledFor(logging.WARNING)
        assert DataContext.get_current().enable_progress_bars
    finally:
        init_ray(cfg)
    assert not progress.isEnabledFor(logging.WARNING)
    assert not DataContext.get_current().enable_progress_bars
