"""bench.cross_encoder_teacher: a reranked ranking is scored as the project scores a first stage,
and the teacher it trains loads as a cross-encoder."""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pytest

from bench.cross_encoder_teacher import labelled_pairs, reranked_metrics, train_cross_encoder
from pipeline.evaluation.retrieval_metrics import ranking_metrics

METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100")


def _retrieval(seed: int = 0, queries: int = 30, docs: int = 400):
    rng = np.random.default_rng(seed)
    unit_docs = rng.normal(size=(docs, 8))
    unit_docs /= np.linalg.norm(unit_docs, axis=1, keepdims=True)
    unit_queries = unit_docs[rng.choice(docs, queries, replace=False)] + 0.6 * rng.normal(size=(queries, 8))
    unit_queries /= np.linalg.norm(unit_queries, axis=1, keepdims=True)
    relevance = [
        {int(d): float(rng.integers(1, 3)) for d in rng.choice(docs, rng.integers(1, 4), replace=False)}
        for _ in range(queries)
    ]
    excluded = [[int(d)] if q % 5 == 0 else [] for q, d in enumerate(rng.integers(0, docs, queries))]
    return unit_queries, unit_docs, relevance, excluded


@pytest.mark.parametrize("depth", [0, 50, 400])
def test_reranking_by_the_first_stages_own_scores_is_the_first_stage(depth):
    unit_queries, unit_docs, relevance, excluded = _retrieval()
    got, pairs = reranked_metrics(
        unit_queries=unit_queries, unit_docs=unit_docs, relevance=relevance, excluded=excluded,
        rerank=lambda queries, docs: np.einsum("ij,ij->i", unit_docs[docs], unit_queries[queries]), depth=depth,
    )  # fmt: skip
    expected = ranking_metrics(unit_queries, unit_docs, relevance, excluded)
    assert got["queries"] == expected.queries
    for name in METRICS:
        assert got[name] == pytest.approx(getattr(expected, name), abs=1e-9), name
    assert pairs == sum(min(depth, len(unit_docs) - len(e)) for e in excluded)


def test_an_oracle_reranker_over_every_document_ranks_each_query_perfectly():
    unit_queries, unit_docs, relevance, excluded = _retrieval(seed=1)
    first_stage = ranking_metrics(unit_queries, unit_docs, relevance, excluded)
    got, _ = reranked_metrics(
        unit_queries=unit_queries, unit_docs=unit_docs, relevance=relevance, excluded=excluded,
        rerank=lambda queries, docs: np.array([relevance[q].get(int(d), 0.0) for q, d in zip(queries, docs, strict=True)]),
        depth=len(unit_docs),
    )  # fmt: skip
    assert first_stage.ndcg_at_10 < 90
    assert got["ndcg_at_10"] == pytest.approx(100.0) and got["mrr_at_10"] == pytest.approx(100.0)
    assert got["recall_at_10"] == pytest.approx(100.0)


def test_labelled_pairs_skip_rows_without_a_label(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("a\tb\t1\nc\td\t0\nno label\there\nx\ty\t2\n\tempty\t1\n", encoding="utf-8")
    assert labelled_pairs(path) == (["a", "c"], ["b", "d"], [1.0, 0.0])


def test_the_trained_teacher_loads_as_a_one_label_cross_encoder(tmp_path, tiny_model_dir):
    from sentence_transformers.cross_encoder import CrossEncoder

    trained = train_cross_encoder(_training_args(tmp_path, tiny_model_dir), tmp_path / "out")
    assert trained.pairs == 40 and trained.seconds > 0 and trained.step == trained.steps == 5
    scores = CrossEncoder(str(trained.model_dir)).predict(
        [("headline 1", "tweet 1"), ("headline 2", "tweet 3")]
    )
    assert np.asarray(scores).shape == (2,)


def _training_args(tmp_path, base, **changes) -> argparse.Namespace:
    rows = [f"headline {i}\ttweet {i}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    settings = dict(
        train=tmp_path / "train.tsv", mined=None, base=base, max_seq_len=16, epochs=1.0, batch_size=8,
        lr=1e-4, seed=0, bf16=False, max_minutes=None,
    )  # fmt: skip
    return argparse.Namespace(**(settings | changes))


def test_a_teacher_trained_in_slices_is_the_teacher_trained_at_once(tmp_path, tiny_model_dir):
    """--max-minutes 0 stops after every step with a checkpoint; calling again goes on from it, and
    the last slice leaves the weights one uninterrupted training gives (same data order, dropout
    and schedule), its checkpoints removed."""
    import torch
    from safetensors.torch import load_file

    whole = train_cross_encoder(_training_args(tmp_path, tiny_model_dir, epochs=2.0), tmp_path / "whole")
    sliced_args = _training_args(tmp_path, tiny_model_dir, epochs=2.0, max_minutes=0.0)
    slices = []
    while not slices or slices[-1].model_dir is None:
        slices.append(train_cross_encoder(sliced_args, tmp_path / "sliced"))
        assert len(slices) <= whole.steps
    assert [s.step for s in slices] == list(range(1, whole.steps + 1)) and whole.steps == 10
    assert all(s.model_dir is None for s in slices[:-1])
    # The seconds add up over the slices.
    assert all(later.seconds > earlier.seconds for earlier, later in itertools.pairwise(slices))
    assert not list((tmp_path / "sliced" / "trainer").glob("checkpoint-*"))
    at_once = load_file(str(whole.model_dir / "model.safetensors"))
    in_slices = load_file(str(slices[-1].model_dir / "model.safetensors"))
    assert at_once.keys() == in_slices.keys()
    for name, weights in at_once.items():
        torch.testing.assert_close(in_slices[name], weights, rtol=0, atol=1e-6, msg=name)


def test_the_run_scores_its_first_stage_as_the_evaluate_job_does(
    tmp_path, paraphrase_corpus, trained_tiny_model_dir, tiny_cross_encoder_dir
):
    """The whole script on a small BEIR set: its first stage alone is jobs/evaluate.py's score of
    that model, and the row it appends says what the teacher reranked."""
    import json

    from conftest import write_beir

    from bench.cross_encoder_teacher import main
    from pipeline.evaluation.retrieval_scoring import evaluate_retrieval_model_dir

    texts, groups = paraphrase_corpus
    members: dict[int, list[str]] = {}
    for text, group in zip(texts, groups, strict=True):
        members.setdefault(int(group), []).append(text)
    dev = [g for g in members.values() if len(g) >= 3][:40]
    beir = write_beir(
        tmp_path / "dev",
        queries={f"q{i}": g[0] for i, g in enumerate(dev)},
        docs={f"d{i}-{k}": g[k] for i, g in enumerate(dev) for k in (1, 2)},
        qrels=[(f"q{i}", f"d{i}-1", 1) for i in range(len(dev))],
    )
    results = tmp_path / "rows.jsonl"
    main([
        "--cross-encoder", str(tiny_cross_encoder_dir), "--first-stage", str(trained_tiny_model_dir),
        "--dev", str(beir), "--depth", "5", "--max-seq-len", "16", "--results", str(results),
    ])  # fmt: skip
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    (expected,) = evaluate_retrieval_model_dir(trained_tiny_model_dir, [str(beir)], max_seq_len=16)
    for name in METRICS:
        assert row["first_stage_alone"][name] == pytest.approx(getattr(expected, name), abs=1e-6), name
    assert row["reranked"]["queries"] == expected.queries == len(dev)
    assert row["depth"] == 5 and row["train"]["pairs"] is None
    # Reranking moves only the top 5: what lies below it is the first stage's.
    assert row["reranked"]["recall_at_100"] == pytest.approx(row["first_stage_alone"]["recall_at_100"])
