"""Retrieval sets (BEIR folders and pair files), their one-line errors, their scores through
the tokenized eval set, and ``jobs/evaluate.py --retrieval`` on a tiny model; data made here."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_script, write_beir

from pipeline.core.errors import DataError
from pipeline.evaluation.retrieval_metrics import ranking_metrics
from pipeline.evaluation.retrieval_scoring import (
    RetrievalEvalSet,
    evaluate_retrieval_model_dir,
    score_retrieval_embeddings,
)
from pipeline.evaluation.retrieval_sets import read_retrieval_set, read_retrieval_sets

# (headline, tweet, label): texts with quotes (read unquoted), a tweet judged for two
# headlines, a headline whose only paraphrase is its own text (skipped: nothing to retrieve)
ROWS = [
    ("storm hits the coast", 'the "storm" hits the coast tonight', 1),
    ("storm hits the coast", "coast storm : stay inside", 1),
    ("storm hits the coast", "election night results", 0),
    ("election results are in", "election night results", 1),
    ("election results are in", 'polls "closed" across the state', 0),
    ("team wins the final", "what a final for the team", 1),
    ("team wins the final", "coast storm : stay inside", 0),
    ("team wins the final", "team wins the final", 0),
    ("markets fall again", "markets fall again", 1),
    ("markets fall again", "stocks drop on friday", 0),
]


def _write_pairs_tsv(path, rows=ROWS):
    path.write_text("".join(f"{a}\t{b}\t{label}\n" for a, b, label in rows), encoding="utf-8")
    return path


def _write_beir(folder, rows=ROWS, split="dev"):
    """The same pairs as a BEIR folder: queries are the headlines with a label-1 row, the corpus
    every distinct tweet, qrels the label-1 rows."""
    queries = list(dict.fromkeys(a for a, _, label in rows if label == 1))
    docs = list(dict.fromkeys(b for _, b, _ in rows))
    write_beir(
        folder,
        queries={f"q{i}": t for i, t in enumerate(queries)},
        docs={f"d{i}": t for i, t in enumerate(docs)},
        qrels=[(f"q{queries.index(a)}", f"d{docs.index(b)}", 1) for a, b, label in rows if label == 1],
        split=split,
    )
    return folder


def _as_texts(item):
    """A set as text: {query: {relevant document text: grade}} and the corpus texts."""
    relevance = {
        q: {item.docs[d]: g for d, g in grades.items()}
        for q, grades in zip(item.queries, item.relevance, strict=True)
    }
    return relevance, item.docs


def test_pair_file_forms_and_beir_folder_read_as_the_same_set(tmp_path):
    tsv = read_retrieval_set(str(_write_pairs_tsv(tmp_path / "dev.tsv")))
    beir = read_retrieval_set(str(_write_beir(tmp_path / "twitter")))
    assert (tsv.name, tsv.format, beir.name, beir.format) == ("dev", "pairs", "twitter", "beir")
    assert _as_texts(tsv) == _as_texts(beir)
    relevance, docs = _as_texts(tsv)
    assert list(relevance) == [
        "storm hits the coast", "election results are in", "team wins the final", "markets fall again",
    ]  # fmt: skip
    assert relevance["storm hits the coast"] == {
        'the "storm" hits the coast tonight': 1.0,
        "coast storm : stay inside": 1.0,
    }
    assert len(docs) == 8 and "stocks drop on friday" in docs  # label-0 tweets are in the corpus
    # csv, jsonl and parquet with named columns (and extra ones) read the same
    records = [{"sentence1": a, "sentence2": b, "label": label, "source": "x"} for a, b, label in ROWS]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "dev.parquet")
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    import csv

    with (tmp_path / "dev.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    for suffix in ("parquet", "jsonl", "csv"):
        assert _as_texts(read_retrieval_set(str(tmp_path / f"dev.{suffix}"))) == _as_texts(tsv), suffix
    names = [s.name for s in read_retrieval_sets([str(tmp_path / "dev.tsv"), str(tmp_path / "dev.csv")])]
    assert names == ["dev", "dev_2"]


def test_beir_splits_titles_grades_and_unjudged_queries(tmp_path):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in ("a", "b", "c"))
    )
    (folder / "corpus.jsonl").write_text(
        json.dumps({"_id": "1", "title": "Title", "text": "one"}) + "\n"
        + json.dumps({"_id": "2", "text": "two"}) + "\n"
    )  # fmt: skip
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\na\t1\t2\na\t2\t0\nb\t2\t1\n")
    only = read_retrieval_set(str(folder))  # the only split there
    assert only.docs == ["Title one", "two"]
    assert only.queries == ["query a", "query b"] and only.unjudged == 1  # c is judged nowhere
    assert only.relevance == [{0: 2.0, 1: 0.0}, {1: 1.0}]
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nc\t1\t1\n")
    with pytest.raises(DataError, match="several qrels splits"):
        read_retrieval_set(str(folder))
    train = read_retrieval_set(f"{folder}#train")
    assert (train.name, train.queries, train.unjudged) == ("beir_train", ["query c"], 2)


def _beir_with_qrels(tmp_path, qrels: str):
    folder = _write_beir(tmp_path / "beir")
    (folder / "qrels" / "dev.tsv").write_text(qrels)
    return str(folder)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: str(p / "nowhere"), "retrieval set not found: {p}/nowhere"),
        (lambda p: str(p / "nowhere") + "#dev", "retrieval set not found: {p}/nowhere is not a folder"),
        (
            lambda p: (p / "empty").mkdir() or str(p / "empty"),
            "{p}/empty: not a BEIR folder, no queries.jsonl",
        ),
        (
            lambda p: (_write_beir(p / "b") / "corpus.jsonl").unlink() or str(p / "b"),
            "{p}/b: not a BEIR folder, no corpus.jsonl",
        ),
        (
            lambda p: str(_write_beir(p / "b", split="test")) + "#dev",
            "{p}/b: no qrels/dev.tsv",
        ),
        (
            lambda p: _beir_with_qrels(p, "query-id\tcorpus-id\tscore\nq0\td0\t1\nq9\td1\t1\n"),
            "{p}/beir/qrels/dev.tsv:3: query id 'q9' is not in queries.jsonl",
        ),
        (
            lambda p: _beir_with_qrels(p, "query-id\tcorpus-id\tscore\nq0\td99\t1\n"),
            "{p}/beir/qrels/dev.tsv:2: corpus id 'd99' is not in corpus.jsonl",
        ),
        (
            lambda p: _beir_with_qrels(p, "q0\td0\tyes\n"),
            "{p}/beir/qrels/dev.tsv:1: score 'yes' is not a number",
        ),
        (
            lambda p: str(_write_pairs_tsv(p / "x.tsv", [*ROWS[:2], ("a", "b", 2)])),
            "{p}/x.tsv:3: label '2' is not 0 or 1",
        ),
        (
            lambda p: (p / "x.tsv").write_text("a\tb\t1\na\tb\n") and str(p / "x.tsv"),
            "{p}/x.tsv:2: pair rows are sentence1<TAB>sentence2<TAB>label, no quoting (got 2 fields)",
        ),
        (
            lambda p: (p / "x.csv").write_text("sentence1,sentence2,score\na,b,1\n") and str(p / "x.csv"),
            "{p}/x.csv: no column 'label' (columns: sentence1, sentence2, score); "
            "pair files need sentence1, sentence2, label",
        ),
        (
            lambda p: (p / "x.jsonl").write_text('{"sentence1": "a", "label": 1}\n') and str(p / "x.jsonl"),
            "{p}/x.jsonl:1: no column 'sentence2' (columns: sentence1, label); "
            "pair files need sentence1, sentence2, label",
        ),
        (
            lambda p: (
                pq.write_table(pa.table({"sentence1": ["a"], "label": [1.5]}), p / "x.parquet")
                or str(p / "x.parquet")
            ),
            "{p}/x.parquet: no column 'sentence2' (columns: sentence1, label); "
            "pair files need sentence1, sentence2, label",
        ),
        (
            lambda p: (p / "x.txt").write_text("a\n") and str(p / "x.txt"),
            "{p}/x.txt: a retrieval set is a BEIR folder or a pair file (.tsv, .csv, .jsonl, .parquet)",
        ),
    ],
)
def test_bad_sets_fail_with_one_line_naming_the_problem(tmp_path, make, message):
    spec = make(tmp_path)
    with pytest.raises(DataError) as err:
        read_retrieval_set(spec)
    assert str(err.value) == message.format(p=tmp_path)


class _SplitTokenizer:
    """Whitespace tokens to ids (enough for RetrievalEvalSet's table)."""

    pad_token_id = 0

    def __call__(self, texts, **_):
        return {"input_ids": [[1 + len(w) for w in t.split()][:8] for t in texts]}


def test_eval_set_scores_each_set_on_its_rows_with_its_own_text_excluded(tmp_path):
    tsv = read_retrieval_set(str(_write_pairs_tsv(tmp_path / "dev.tsv")))
    beir = read_retrieval_set(str(_write_beir(tmp_path / "twitter")))
    eval_set = RetrievalEvalSet([tsv, beir], _SplitTokenizer(), 8)
    texts = eval_set.table.column("text").to_pylist()
    assert len(texts) == len(set(texts)) == 10  # 4 headlines, 8 tweets, two texts both; shared by the sets
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(len(texts), 6))
    first, second = score_retrieval_embeddings(eval_set, embeddings)
    assert (first.name, first.queries, first.skipped, first.corpus) == ("dev", 3, 1, 8)
    assert {k.removeprefix("retrieval_dev_") for k in first.metrics()} == {
        "ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100",
    }  # fmt: skip
    assert second.as_dict() | {"name": "dev", "path": ""} == first.as_dict() | {"path": ""}
    # against the metrics called directly on the set's own rows and own-text exclusions
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    where = {t: i for i, t in enumerate(texts)}
    q = np.array([where[t] for t in tsv.queries])
    d = np.array([where[t] for t in tsv.docs])
    own = [[j for j, t in enumerate(tsv.docs) if t == query] for query in tsv.queries]
    direct = ranking_metrics(unit[q], unit[d], tsv.relevance, own)
    assert first.ndcg_at_10 == pytest.approx(direct.ndcg_at_10)
    assert first.recall_at_10 == pytest.approx(direct.recall_at_10)


def test_evaluate_job_retrieval_json_on_a_tiny_model(tmp_path, tiny_model_dir, capsys):
    tsv = _write_pairs_tsv(tmp_path / "pairs.tsv")
    beir = _write_beir(tmp_path / "twitter")
    evaluate = load_script("jobs/evaluate.py", "evaluate_job")
    assert (
        evaluate.main(
            ["--model", str(tiny_model_dir), "--retrieval", str(beir), "--retrieval", str(tsv), "--json"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["retrieval"]
    by_name = {s["name"]: s for s in result["retrieval"]}
    assert set(by_name) == {"twitter", "pairs"}
    expected = {s.name: s for s in evaluate_retrieval_model_dir(tiny_model_dir, [str(beir), str(tsv)])}
    for name, got in by_name.items():
        assert (got["queries"], got["skipped"], got["corpus"]) == (3, 1, 8)
        for key in ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100"):
            assert got[key] == pytest.approx(getattr(expected[name], key)) and 0 <= got[key] <= 100
    assert by_name["twitter"] | {"name": "", "path": ""} == by_name["pairs"] | {"name": "", "path": ""}

    # with --sts: the STS contract's keys beside "retrieval"
    sts = tmp_path / "sts.jsonl"
    sts.write_text(
        "".join(
            json.dumps({"sentence1": a, "sentence2": b, "score": 5.0 * label}) + "\n" for a, b, label in ROWS
        )
    )
    assert (
        evaluate.main(["--model", str(tiny_model_dir), "--sts", str(sts), "--retrieval", str(tsv), "--json"])
        == 0
    )
    both = json.loads(capsys.readouterr().out)
    assert isinstance(both["spearman"], float) and both["pairs"] == len(ROWS)
    assert [s["name"] for s in both["retrieval"]] == ["pairs"]

    # a bad set: one line, before any encoding
    assert evaluate.main(["--model", str(tiny_model_dir), "--retrieval", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: retrieval set not found: {tmp_path / 'missing'}"
    ]
    with pytest.raises(SystemExit) as usage:
        evaluate.main(["--model", str(tiny_model_dir)])
    assert usage.value.code == 2 and "at least one --sts FILE or --retrieval PATH" in capsys.readouterr().err
