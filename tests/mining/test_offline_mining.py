"""mine_pairs (the training job's miner, run once with the folder's weights) against its
contract. jobs/mine.py end to end: on a text file, the mining job of tests/test_cotenancy.py
(beside other Ray work); on a pair file, with the training job's negatives to compare with,
tests/test_retrieval_pairs.py (each whole job a test starts costs about 50 s of CPU:
docs/operations.md, "Tests")."""

from __future__ import annotations

import numpy as np
import torch
from conftest import assert_clean_negatives

from pipeline.config.loading import load_config
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.triplets import index_triplets
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


def _mined(anchors, positives, model_dir, cfg):
    """``mine_pairs`` of rows held here: their distinct texts put in the object store, as the job
    puts what it read."""
    import ray

    table, triplets = index_triplets(anchors, positives, None)
    texts = DistinctTexts(table.column("id").to_numpy(), [ray.put(table)])
    return mine_pairs(texts, triplets, model_dir, cfg)


def test_mine_pairs_filters_and_counts(trained_tiny_model_dir, paraphrase_corpus, ray_local):
    texts, groups = paraphrase_corpus
    anchors, positives = _pairs(texts, groups)
    # A case/punctuation variant of a positive in the pool must never be mined for its anchor.
    anchors.append(anchors[0])
    positives.append(positives[0].upper().rstrip("."))
    model, tokenizer = load_sentence_encoder(trained_tiny_model_dir), load_tokenizer(trained_tiny_model_dir)
    cfg = load_config(None, ["mining.num_negatives=3", "mining.top_k=20"])
    table, report = _mined(anchors, positives, trained_tiny_model_dir, cfg)
    assert table.column_names == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert_clean_negatives(table.to_pylist(), 3)
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
    from pipeline.model.encode import encode_texts

    vectors = encode_texts(model, tokenizer, texts, max_seq_len=32, batch_size=64, device=torch.device("cpu"))
    rng = np.random.default_rng(0)
    a, b = rng.integers(len(texts), size=(2, 500))
    return float(np.einsum("ij,ij->i", vectors[a], vectors[b]).mean())


def test_mine_pairs_encodes_where_the_training_miner_would(
    trained_tiny_model_dir, paraphrase_corpus, ray_local
):
    """``mining.num_gpus`` > 0 asks the offline job, as the training miner, to encode (and
    search) on this process's GPU; on a machine without one it runs on the CPU and mines the same
    negatives. The report says where and in what precision it encoded (fp32 on any CPU)."""
    texts, groups = paraphrase_corpus
    anchors, positives = _pairs(texts, groups)
    on_cpu = load_config(None, ["mining.top_k=20"])
    on_gpu = load_config(None, ["mining.top_k=20", "mining.num_gpus=1"])
    cpu_table, cpu_report = _mined(anchors, positives, trained_tiny_model_dir, on_cpu)
    gpu_table, gpu_report = _mined(anchors, positives, trained_tiny_model_dir, on_gpu)
    has_gpu = torch.cuda.is_available()
    assert cpu_report.encode_device == "cpu"
    assert cpu_report.encode_dtype == "fp32"
    assert gpu_report.encode_device == ("cuda" if has_gpu else "cpu")
    assert f"(encoded on {gpu_report.encode_device} in {gpu_report.encode_dtype})" in gpu_report.render("out")
    if not has_gpu:
        assert gpu_report.backend == cpu_report.backend == "faiss-cpu/flat"
        assert gpu_table.equals(cpu_table)


def test_mine_pairs_over_two_shards_writes_what_one_process_writes(
    trained_tiny_model_dir, paraphrase_corpus, ray_local
):
    """``mining.shards: 2`` spreads the offline job over two shard actors (each a range of the
    texts, their vectors and index) as it spreads a training refresh: the same output table and
    the same counts as mining in this process."""
    texts, groups = paraphrase_corpus
    anchors, positives = _pairs(texts, groups)
    overrides = ["mining.num_negatives=2", "mining.top_k=20", "mining.num_cpus=0.5"]
    one_table, one = _mined(anchors, positives, trained_tiny_model_dir, load_config(None, overrides))
    two_table, two = _mined(
        anchors, positives, trained_tiny_model_dir, load_config(None, [*overrides, "mining.shards=2"])
    )
    assert two.backend == "faiss-cpu/flat x2" and one.backend == "faiss-cpu/flat"
    assert two_table.num_rows > 0.8 * len(anchors)  # most anchors found both
    assert two_table.equals(one_table)
    for name in ("candidates", "kept", "anchors_short", *(f"removed_{f}" for f in FILTERS)):
        assert two.count(name) == one.count(name), name
