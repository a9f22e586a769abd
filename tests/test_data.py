"""The corpus stage on a real local Ray: every reader, cleaning, dedup, ids, tokenization."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import DataSection
from pipeline.data import (
    DataError,
    TokenizedCorpus,
    check_corpus_path,
    load_clean_corpus,
    stable_row_id,
    tokenize_corpus,
)
from pipeline.model import load_tokenizer

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
    corpus, stats = load_clean_corpus(section)
    assert set(corpus.column("text").to_pylist()) == CLEAN
    assert stats.sentences == 3 and stats.duplicates_dropped == 1
    assert stats.rows_read - stats.empty_dropped - stats.duplicates_dropped == 3
    assert stats.rows_read == 6 and stats.empty_dropped == 2
    ids = corpus.column("id").to_pylist()
    assert ids == sorted(ids)
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


def test_tokenize_matches_tokenizer_and_batches_pad(ray_local, tmp_path, tiny_model_dir, paraphrase_corpus):
    texts, _ = paraphrase_corpus
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts))
    section = DataSection(path=str(path), max_seq_len=8, tokenize_batch_size=50)
    corpus, _ = load_clean_corpus(section)
    tokenizer = load_tokenizer(tiny_model_dir)
    table = tokenize_corpus(corpus, tokenizer, section)
    assert table.column("id").to_pylist() == corpus.column("id").to_pylist()
    expected = tokenizer(table.column("text").to_pylist(), truncation=True, max_length=8)["input_ids"]
    assert table.column("input_ids").to_pylist() == expected
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
    import importlib.util

    from conftest import REPO

    texts, _ = paraphrase_corpus
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts[:500] + texts[:50] + ["", "  "]) + "\n")
    corpus, stats = load_clean_corpus(DataSection(path=str(path), max_rows=120))
    assert corpus.num_rows == 120 and stats.beyond_max_rows == 500 - 120 and stats.duplicates_dropped == 50
    expected = sorted(texts[:500], key=stable_row_id)[:120]
    assert corpus.column("text").to_pylist() == expected

    spec = importlib.util.spec_from_file_location("st_mnrl_recipe", REPO / "bench/st_mnrl_recipe.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    rows = peer.training_rows(str(path), 120)
    assert rows["anchor"] == expected and rows["positive"] == expected
