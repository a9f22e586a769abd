"""jobs/mine.py end to end on both input kinds, and mine_pairs against its contract."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import PYTHON, REPO
from mlflow.tracking import MlflowClient

from bench.common import job_env
from pipeline.config.loading import load_config
from pipeline.jobs.pair_mining import mine_pairs
from pipeline.mining.negatives import FILTERS
from pipeline.mining.text_keys import normalize_text
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer


def _pairs(texts, groups):
    """(anchor, positive) = two members of one paraphrase group."""
    members: dict[int, list[str]] = {}
    for text, group in zip(texts, groups, strict=True):
        members.setdefault(int(group), []).append(text)
    anchors, positives = [], []
    for group_members in members.values():
        for i, anchor in enumerate(group_members):
            anchors.append(anchor)
            positives.append(group_members[(i + 1) % len(group_members)])
    return anchors, positives


def _assert_clean(rows, num_negatives):
    for row in rows:
        negatives = [row[f"negative_{j + 1}"] for j in range(num_negatives)]
        forbidden = {normalize_text(row["anchor"]), normalize_text(row["positive"])}
        assert all(isinstance(n, str) and n for n in negatives)
        assert not forbidden & {normalize_text(n) for n in negatives}
        assert len(set(negatives)) == num_negatives


def test_mine_pairs_filters_and_counts(trained_tiny_model_dir, paraphrase_corpus):
    texts, groups = paraphrase_corpus
    anchors, positives = _pairs(texts, groups)
    # A case/punctuation variant of a positive in the pool must never be mined for its anchor.
    anchors.append(anchors[0])
    positives.append(positives[0].upper().rstrip("."))
    model, tokenizer = load_sentence_encoder(trained_tiny_model_dir), load_tokenizer(trained_tiny_model_dir)
    cfg = load_config(None, ["mining.num_negatives=3", "mining.top_k=20"])
    table, report = mine_pairs(anchors, positives, model, tokenizer, cfg)
    assert table.column_names == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    _assert_clean(table.to_pylist(), 3)
    assert report.rows_out == table.num_rows == len(anchors) - report.count("anchors_short")
    removed = sum(report.count(f"removed_{name}") for name in FILTERS)
    assert report.count("candidates") == report.count("kept") + removed
    assert report.count("removed_duplicate") >= len(anchors)  # each anchor's positive is its top hit
    # False negatives: the anchor's other paraphrases are (almost) never mined as negatives.
    group_of = {normalize_text(t): g for t, g in zip(texts, groups.tolist(), strict=True)}
    mined_same = sum(
        group_of[normalize_text(row[f"negative_{j}"])] == group_of[normalize_text(row["anchor"])]
        for row in table.to_pylist()
        for j in (1, 2, 3)
    )
    other_paraphrases = 2 * table.num_rows  # groups of 4: anchor, positive and two others
    assert mined_same <= 0.05 * other_paraphrases
    # Kept negatives are hard: far nearer to the anchor than random pool sentences.
    assert report.mined["mining/negative_similarity_mean"] > 0.3 + _random_pair_similarity(
        model, tokenizer, texts
    )


def _random_pair_similarity(model, tokenizer, texts):
    import torch

    from pipeline.model.encode import encode_texts

    vectors = encode_texts(model, tokenizer, texts, 32, 64, torch.device("cpu"))
    rng = np.random.default_rng(0)
    a, b = rng.integers(len(texts), size=(2, 500))
    return float(np.einsum("ij,ij->i", vectors[a], vectors[b]).mean())


def _mine(tmp_path, model_dir, input_path, output, *sets):
    args = [
        PYTHON,
        str(REPO / "jobs/mine.py"),
        "--model",
        str(model_dir),
        "--input",
        str(input_path),
        "--output",
        str(output),
    ]
    for item in sets:
        args += ["--set", item]
    env = job_env({"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns.db'}"})
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.job
def test_mine_job_on_text_and_pairs(tmp_path, trained_tiny_model_dir, paraphrase_corpus):
    texts, groups = paraphrase_corpus
    text_file = tmp_path / "sentences.txt"
    text_file.write_text("\n".join(texts + ["", texts[0]]) + "\n")
    out_parquet = tmp_path / "out" / "triplets.parquet"
    proc = _mine(
        tmp_path,
        trained_tiny_model_dir,
        text_file,
        out_parquet,
        "mining.num_negatives=2",
        "model.pooler=mean",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "too few" in proc.stdout and "removed: duplicate" in proc.stdout
    assert "[mining] flat index over" in proc.stdout  # memory estimate, printed before building
    table = pq.read_table(out_parquet)
    assert table.column_names == ["anchor", "positive", "negative_1", "negative_2"]
    rows = table.to_pylist()
    assert all(r["anchor"] == r["positive"] for r in rows)
    _assert_clean(rows, 2)
    assert table.num_rows >= 0.9 * len(texts)
    from datasets import load_dataset

    assert load_dataset("parquet", data_files=str(out_parquet), split="train").num_rows == table.num_rows

    anchors, positives = _pairs(texts, groups)
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text(
        "".join(json.dumps({"q": a, "p": b}) + "\n" for a, b in zip(anchors, positives, strict=True))
    )
    out_jsonl = tmp_path / "triplets.jsonl"
    proc = _mine(
        tmp_path, trained_tiny_model_dir, pairs_file, out_jsonl,
        "data.anchor_column=q", "data.positive_column=p", "mining.num_negatives=1", "model.pooler=mean",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out_jsonl.read_text().splitlines()]
    assert rows and set(rows[0]) == {"anchor", "positive", "negative_1"}
    _assert_clean(rows, 1)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = client.search_runs([client.get_experiment_by_name("simcse-mining").experiment_id])
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.metrics["mining/rows_out"] for r in runs} == {table.num_rows, len(rows)}
    # The run a reviewer opens: named in the summary, described, with its input as a dataset,
    # a similarity histogram and a sample of the rows it wrote.
    run = next(r for r in runs if r.data.metrics["mining/rows_out"] == len(rows))
    assert f"  mlflow run    {run.info.run_id} (experiment 'simcse-mining')" in proc.stdout
    assert f"written of {len(anchors)} pairs" in run.data.tags["mlflow.note.content"]
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.digest == run.data.tags["data.digest"]
    assert {t.value for t in dataset.tags} == {"mining"}
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "review")) == [
        "review/sample_triplets.md",
        "review/similarity.png",
    ]
    sample = Path(client.download_artifacts(run.info.run_id, "review/sample_triplets.md", str(tmp_path)))
    assert f"| {rows[0]['anchor']} | {rows[0]['positive']} | {rows[0]['negative_1']} |" in sample.read_text()
    assert all(k.startswith("mining/") for k in run.data.metrics)
