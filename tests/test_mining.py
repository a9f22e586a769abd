"""Batch plans, exact kNN and the miner on a corpus with known paraphrase groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.index import knn_search
from pipeline.mining import HardNegativeMiner, exclude_self_and_same_text
from pipeline.model import load_sentence_encoder, pack_dir
from pipeline.plans import balanced_batch_sizes, neighbourhood_plan, random_plan, worker_slices


def _assert_covers_once(plan, n):
    assert sorted(plan.rows.tolist()) == list(range(n))
    assert plan.sizes.sum() == n
    assert plan.sizes.max() - plan.sizes.min() <= 1
    assert [len(b) for b in plan.batches()] == plan.sizes.tolist()


def test_balanced_sizes_and_worker_slices():
    assert balanced_batch_sizes(130, 64).tolist() == [44, 43, 43]
    assert balanced_batch_sizes(128, 64).tolist() == [64, 64]
    with pytest.raises(ValueError, match="batch_size"):
        balanced_batch_sizes(10, 64)
    assert worker_slices(7, 2) == [4, 3] and sum(worker_slices(43, 3)) == 43


def test_random_plan_covers_every_row_once_and_is_seeded():
    plan = random_plan(1000, 64, seed=5)
    _assert_covers_once(plan, 1000)
    assert np.array_equal(plan.rows, random_plan(1000, 64, seed=5).rows)
    assert not np.array_equal(plan.rows, random_plan(1000, 64, seed=6).rows)


def test_knn_matches_brute_force():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    result = knn_search(x, 10)
    brute = np.argsort(-(x @ x.T), axis=1)[:, :10]
    assert result.backend == "faiss-cpu/flat"
    assert np.array_equal(result.indices[:, 0], np.arange(300))  # itself first
    assert (result.indices == brute).mean() > 0.99  # ties aside, identical
    np.testing.assert_allclose(result.scores, np.take_along_axis(x @ x.T, brute, 1), atol=1e-5)


def test_exclusion_of_self_and_same_text():
    indices = np.array([[0, 1, 2], [1, 0, -1], [2, 3, 0], [3, 2, 1]])
    ids = np.array([7, 8, 7, 9])  # rows 0 and 2 are the same sentence
    cleaned, removed = exclude_self_and_same_text(indices, ids)
    assert cleaned.tolist() == [[-1, 1, -1], [-1, 0, -1], [-1, 3, -1], [-1, 2, 1]]
    assert removed == 6


def _clustered(n_groups=40, size=8, dim=24, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_groups, dim))
    groups = np.repeat(np.arange(n_groups), size)
    x = centres[groups] + 0.3 * rng.normal(size=(len(groups), dim))
    perm = rng.permutation(len(groups))
    x = (x[perm] / np.linalg.norm(x[perm], axis=1, keepdims=True)).astype(np.float32)
    return x, groups[perm]


def _same_group_pair_rate(plan, groups):
    same = pairs = 0
    for rows in plan.batches():
        g = groups[rows]
        same += int((g[:, None] == g[None, :]).sum() - len(rows))
        pairs += len(rows) * (len(rows) - 1)
    return same / pairs


def test_neighbourhood_plan_groups_neighbours_and_covers_corpus():
    x, groups = _clustered()
    knn = knn_search(x, 12)
    neighbours, _ = exclude_self_and_same_text(knn.indices, np.arange(len(x)))
    plan = neighbourhood_plan(neighbours, knn.scores, batch_size=16, seed=3, version=1)
    _assert_covers_once(plan, len(x))
    assert plan.version == 1
    chance = 7 / (len(x) - 1)  # a random other row shares the group with this probability
    mined = _same_group_pair_rate(plan, groups)
    assert mined > 0.3 > 10 * chance  # with batch 16 and groups of 8 the ceiling is 7/15 = 0.47
    assert _same_group_pair_rate(random_plan(len(x), 16, seed=3), groups) < 3 * chance
    again = neighbourhood_plan(neighbours, knn.scores, batch_size=16, seed=3, version=1)
    assert np.array_equal(plan.rows, again.rows) and np.array_equal(plan.sizes, again.sizes)


def test_miner_on_paraphrase_groups(tiny_model_dir, tokenized_corpus):
    table, groups = tokenized_corpus
    n = table.num_rows
    miner = HardNegativeMiner(
        table, pack_dir(tiny_model_dir), pooler="mean", batch_size=16, top_k=8, encode_batch_size=64, seed=11
    )
    assert miner.ready() == n
    weights = load_sentence_encoder(tiny_model_dir, pooler="mean").encoder.state_dict()
    report = miner.refresh(weights, version=1, step=0)
    plan = report.plan
    _assert_covers_once(plan, n)
    chance = 3 / (n - 1)  # groups of 4
    assert _same_group_pair_rate(plan, groups) > 8 * chance
    assert (
        report.metrics["mining_batch_similarity_mean"] > report.metrics["mining_random_batch_similarity_mean"]
    )
    assert report.metrics["mining_self_or_same_text_removed"] >= n  # every row found itself
    assert report.metrics["mining_corpus_size"] == n
    for key in ("mining_encode_s", "mining_index_s", "mining_search_s", "mining_top1_similarity_mean"):
        assert np.isfinite(report.metrics[key])
    # Deterministic for a fixed seed and weights.
    again = miner.refresh(weights, version=1, step=0).plan
    assert np.array_equal(plan.rows, again.rows)
    # Embeddings reflect the weights given: zeroing the word embeddings changes the plan.
    changed = {k: torch.zeros_like(v) if "word_embeddings" in k else v for k, v in weights.items()}
    assert miner.refresh(changed, version=2, step=0).metrics["mining_top1_similarity_mean"] > 0.999


def _clustered_random(n=20000, dim=48, per_cluster=50, noise=0.8, seed=0):
    """Random data shaped like embeddings: a Gaussian mixture on the unit sphere."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // per_cluster, dim))
    x = centres[rng.integers(len(centres), size=n)] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_ivf_agrees_with_flat_at_default_nprobe():
    from pipeline.index import IndexSpec

    x = _clustered_random()
    flat = knn_search(x, 10, spec=IndexSpec(kind="flat"))
    ivf = knn_search(x, 10, spec=IndexSpec(kind="ivf"))
    assert ivf.backend == "faiss-cpu/ivf"
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ivf.indices, flat.indices, strict=True)])
    assert recall >= 0.95
    # auto switches to IVF above flat_max_rows
    assert knn_search(x[:2000], 5, spec=IndexSpec(flat_max_rows=1000)).backend == "faiss-cpu/ivf"
    pq = knn_search(x, 10, spec=IndexSpec(kind="ivfpq", pq_m=16))
    assert np.mean(pq.indices[:, 0] == np.arange(len(x))) > 0.5  # approximate, but finds itself often


def test_memory_estimate_counts_vectors_and_results():
    from pipeline.index import IndexSpec, estimate_index_bytes

    n, d, k = 1_000_000, 384, 33
    flat = estimate_index_bytes(n, d, k, "flat")
    assert flat == 2 * n * d * 4 + n * k * 12
    assert estimate_index_bytes(n, d, k, "ivfpq", IndexSpec(pq_m=16)) < 0.6 * flat
    assert estimate_index_bytes(n, d, k, "ivf") > flat
