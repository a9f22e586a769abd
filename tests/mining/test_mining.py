"""Batch plans, exact kNN and the miner on a corpus with known paraphrase groups."""

from __future__ import annotations

import dataclasses
import itertools
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import blocks_of

from bench.embedded_texts import vector_index
from pipeline.batching.plan import balanced_batch_sizes, worker_slices
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import neighbourhood_plan, random_plan
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec, torch_top_k
from pipeline.mining.miner import HardNegativeMiner
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.mining.plan_quality import false_negative_pairs, together_again
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import pack_dir


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


def knn_search(x: np.ndarray, k: int, spec: IndexSpec | None = None) -> SimpleNamespace:
    """Every row's top ``k`` among the rows of ``x``: one index built and searched."""
    index = vector_index(x, kind=(spec or IndexSpec()).kind)
    scores, indices = index.search(x, k)
    return SimpleNamespace(scores=scores, indices=indices, backend=index.backend)


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


def test_torch_top_k_finds_what_faiss_finds():
    """The torch path (the ``torch-cuda`` backend; here on the CPU) against faiss' exact k-NN,
    in query chunks that do not divide the queries."""
    import faiss

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries = x[:70].copy()
    scores, indices = torch_top_k(torch.from_numpy(x), queries, 10, query_chunk=32)
    reference_scores, reference = faiss.knn(queries, x, 10, faiss.METRIC_INNER_PRODUCT)
    assert np.array_equal(indices[:, 0], np.arange(70))  # itself first
    assert (indices == reference).mean() > 0.99  # ties aside, identical
    np.testing.assert_allclose(scores, reference_scores, atol=1e-5)


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
    neighbours = np.where(knn.indices == np.arange(len(x))[:, None], -1, knn.indices)
    plan = neighbourhood_plan(SamplerInputs(neighbours, knn.scores, None, batch_size=16, seed=3, version=1))
    _assert_covers_once(plan, len(x))
    assert plan.version == 1
    chance = 7 / (len(x) - 1)  # a random other row shares the group with this probability
    mined = _same_group_pair_rate(plan, groups)
    assert mined > 0.3 > 10 * chance  # with batch 16 and groups of 8 the ceiling is 7/15 = 0.47
    assert _same_group_pair_rate(random_plan(len(x), 16, seed=3), groups) < 3 * chance
    again = neighbourhood_plan(SamplerInputs(neighbours, knn.scores, None, batch_size=16, seed=3, version=1))
    assert np.array_equal(plan.rows, again.rows) and np.array_equal(plan.sizes, again.sizes)


def _same_group_pairs_together(plan, groups, neighbours):
    """Of the (row, k-NN neighbour) pairs from the same paraphrase group, the share that
    ended up in one batch, i.e. trained as each other's negatives."""
    batch_of = np.empty(len(plan.rows), dtype=np.int64)
    batch_of[plan.rows] = np.repeat(np.arange(plan.num_batches), plan.sizes)
    rows, cols = np.nonzero(neighbours >= 0)
    other = neighbours[rows, cols]
    same = (groups[rows] == groups[other]) & (rows != other)
    return float((batch_of[rows[same]] == batch_of[other[same]]).mean())


def test_miner_settings_come_from_the_config():
    from pipeline.config.loading import load_config

    cfg = load_config(
        overrides=[
            "train.group_by_length=true", "mining.top_k=16",
            "mining.num_gpus=1", "train.max_failures=2", "mining.range_min=3", "mining.index=ivf",
        ]
    )  # fmt: skip
    settings = MinerSettings.from_config(cfg, "sqlite:///x.db", "run-1")
    assert (settings.search.top_k, settings.max_restarts) == (16, 2)
    assert settings.use_gpu and settings.num_gpus == 1 and settings.pooler == cfg.model.pooler
    assert settings.filters == NegativeFilters.from_config(cfg) and settings.filters.range_min == 3
    assert settings.search.index == IndexSpec("ivf")
    assert (settings.tracking_uri, settings.run_id) == ("sqlite:///x.db", "run-1")


def test_miner_keeps_paraphrases_out_of_batches(trained_tiny_model_dir, tokenized_corpus, ray_local):
    from pipeline.mining.negatives import NegativeFilters

    table, groups = tokenized_corpus
    n = table.num_rows
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()

    def refresh(filters, version=1):
        settings = MinerSettings(
            pooler="mean", batch_size=16, search=SearchSettings(top_k=64), seed=11, filters=filters,
            batch_sampler="knn",  # batches of near neighbours, paraphrases apart
        )  # fmt: skip
        miner = HardNegativeMiner(blocks_of(table), pack_dir(trained_tiny_model_dir), settings)
        assert miner.ready() == os.getpid()  # its process: a restarted miner answers another
        return miner, miner.refresh(weights, version=version, step=0)

    miner, report = refresh(NegativeFilters())  # the defaults
    plan, metrics = report.plan, report.metrics
    _assert_covers_once(plan, n)
    knn = knn_search(_embeddings(trained_tiny_model_dir, table), 64)
    # Same-group rows are the nearest: a paraphrase-rich corpus, as the test intends.
    assert (groups[knn.indices[:, 1:4]] == groups[:, None]).mean() > 0.8
    assert _same_group_pairs_together(plan, groups, knn.indices) <= 0.05
    # Only the last batches of so small a corpus, where every row left is somebody's false
    # negative, may have to pair them: a small share of all flagged pairs.
    assert metrics["mining/false_negatives_flagged"] >= 10 * n  # range_min=10 flags each row's 10 nearest
    assert (
        metrics["mining/false_negative_pairs_in_batches"] <= 0.02 * metrics["mining/false_negatives_flagged"]
    )
    # ...while the negatives kept are still far nearer than random ones.
    assert metrics["mining/batch_similarity_mean"] > 2 * metrics["mining/random_batch_similarity_mean"] > 0
    # Without the false-negative filters the same plan would put most paraphrases together.
    _, unfiltered = refresh(NegativeFilters(range_min=0, relative_margin=None))
    assert _same_group_pairs_together(unfiltered.plan, groups, knn.indices) > 0.5

    assert metrics["mining/removed_duplicate"] >= n  # every row found itself
    assert metrics["mining/removed_rank_window"] >= 10 * n
    assert metrics["mining/candidates"] == metrics["mining/kept"] + sum(
        metrics[f"mining/removed_{f}"] for f in ("duplicate", "rank_window", "max_score", "relative_margin")
    )
    for key in ("mining/encode_s", "mining/index_s", "mining/search_s", "mining/top1_similarity_mean"):
        assert np.isfinite(metrics[key])
    # Deterministic for a fixed seed and weights; churn against the previous plan is logged.
    again = miner.refresh(weights, version=1, step=0)
    assert np.array_equal(plan.rows, again.plan.rows)
    assert again.metrics["mining/churn"] == pytest.approx(_churn(plan, again.plan)) == 0.0
    # Embeddings reflect the weights given: zeroed word embeddings make every sentence alike.
    changed = {k: torch.zeros_like(v) if "word_embeddings" in k else v for k, v in weights.items()}
    assert miner.refresh(changed, version=2, step=0).metrics["mining/top1_similarity_mean"] > 0.999


def _embeddings(model_dir, table):
    from pipeline.data.tokenized import TokenizedCorpus
    from pipeline.model.encode import encode_rows
    from pipeline.model.folders import load_tokenizer

    corpus = TokenizedCorpus(table, load_tokenizer(model_dir).pad_token_id)
    model = load_sentence_encoder(model_dir, pooler="mean")
    return encode_rows(model, corpus, np.arange(table.num_rows), batch_size=64, device=torch.device("cpu"))


def _churn(previous, current) -> float:
    """Share of ``current``'s in-batch pairs that did not share a batch of ``previous``, by
    listing every pair: the independent count that ``mining/churn`` is checked against."""

    def pairs(plan) -> list[frozenset]:
        return [frozenset(p) for batch in plan.batches() for p in itertools.combinations(batch.tolist(), 2)]

    before = set(pairs(previous))
    now = pairs(current)
    return sum(p not in before for p in now) / max(len(now), 1)


def test_churn_and_false_negative_pair_counts():
    from pipeline.batching.plan import BatchPlan

    a = BatchPlan(1, np.array([0, 1, 2, 3, 4, 5]), np.array([3, 3]))
    b = BatchPlan(2, np.array([0, 1, 3, 2, 4, 5]), np.array([3, 3]))
    # b's pairs: {0,1} kept, {0,3},{1,3} new; {2,4},{2,5} new, {4,5} kept -> 4 of 6 new
    assert _churn(a, b) == pytest.approx(4 / 6)
    # The refresh's streamed count: ordered pairs, each batch's rows with their batch in a.
    assert together_again(np.array([0, 0, 1, 0, 1, 1]), b) == (4, 12)
    assert together_again(np.array([0, 0, 0, 1, 1, 1]), a) == (12, 12)
    flagged = np.array([[1, -1], [-1, -1], [3, 5], [-1, -1], [-1, -1], [-1, -1]])
    assert false_negative_pairs(a, flagged) == 1  # (0, 1) share a batch; 2 is apart from 3 and 5


def _clustered_random(n=20000, dim=48, per_cluster=50, noise=0.8, seed=0):
    """Random data shaped like embeddings: a Gaussian mixture on the unit sphere."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // per_cluster, dim))
    x = centres[rng.integers(len(centres), size=n)] + noise * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_ivf_agrees_with_flat_at_default_nprobe():
    from pipeline.mining.index import IndexSpec

    x = _clustered_random()
    flat = knn_search(x, 10, spec=IndexSpec(kind="flat"))
    ivf = knn_search(x, 10, spec=IndexSpec(kind="ivf"))
    assert ivf.backend == "faiss-cpu/ivf"
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ivf.indices, flat.indices, strict=True)])
    assert recall >= 0.95
    pq = knn_search(x, 10, spec=IndexSpec(kind="ivfpq"))
    assert np.mean(pq.indices[:, 0] == np.arange(len(x))) > 0.5  # approximate, but finds itself often


def test_auto_is_flat_up_to_the_devices_limit_and_ivf_above():
    from pipeline.mining.index import FLAT_MAX_ROWS_CPU, FLAT_MAX_ROWS_GPU, IndexSpec

    auto = IndexSpec()
    assert (auto.resolve(FLAT_MAX_ROWS_CPU), auto.resolve(FLAT_MAX_ROWS_CPU + 1)) == ("flat", "ivf")
    assert auto.resolve(FLAT_MAX_ROWS_CPU + 1, "torch-cuda") == "flat"
    assert auto.resolve(FLAT_MAX_ROWS_GPU + 1, "faiss-gpu") == "ivf"
    assert IndexSpec("ivfpq").resolve(10) == "ivfpq"


def test_pq_bytes_divide_the_dimension():
    from pipeline.mining.index import pq_bytes

    assert (pq_bytes(384), pq_bytes(100), pq_bytes(63)) == (16, 4, 1)


def test_memory_estimate_counts_vectors_and_results():
    from pipeline.mining.index import estimate_index_bytes

    n, d, k = 1_000_000, 384, 33
    flat = estimate_index_bytes(n, d, k, "flat")
    assert flat == 2 * n * d * 4 + n * k * 12
    assert estimate_index_bytes(n, d, k, "ivfpq") < 0.6 * flat
    assert estimate_index_bytes(n, d, k, "ivf") > flat
    assert estimate_index_bytes(n, d, k, "flat", queries=1000) == 2 * n * d * 4 + 1000 * k * 12


def test_auto_turns_to_ivfpq_where_the_vectors_would_not_fit_and_a_kind_that_cannot_fit_is_one_line():
    from pipeline.core.errors import ConfigError
    from pipeline.mining.index import IndexSpec, index_bytes

    n, d = 3_000_000, 768  # 8.6 GiB of float32 vectors in a flat index
    flat, pq = index_bytes(n, d, "flat"), index_bytes(n, d, "ivfpq")
    one_m = index_bytes(1_000_000, d, "flat")
    assert IndexSpec("auto").resolve(1_000_000, "faiss-gpu", dim=d, budget=one_m) == "flat"  # just fits
    assert IndexSpec("auto").resolve(1_000_000, "faiss-gpu", dim=d, budget=one_m - 1) == "ivfpq"
    assert IndexSpec("auto").resolve(n, "faiss-cpu", dim=d, budget=index_bytes(n, d, "ivf")) == "ivf"
    assert IndexSpec("auto").resolve(n, "faiss-cpu", dim=d, budget=flat) == "ivfpq"
    assert IndexSpec("auto").resolve(1000, "faiss-cpu", dim=d, budget=10**9) == "flat"
    assert IndexSpec("ivfpq").resolve(n, "faiss-cpu", dim=d, budget=pq) == "ivfpq"
    with pytest.raises(ConfigError) as raised:
        IndexSpec("flat").resolve(n, "faiss-cpu", dim=d, budget=2**30)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("mining.index: a flat index over 3000000 x 768")
    assert "8.6 GiB" in message and "1.0 GiB" in message
    with pytest.raises(ConfigError, match="mining.index: a ivfpq index"):
        IndexSpec("auto").resolve(n, "faiss-cpu", dim=d, budget=pq - 1)


def test_torch_query_chunk_keeps_its_scores_within_half_the_free_memory():
    from pipeline.mining.index import query_chunk_for

    gib = 2**30
    chunk = query_chunk_for(40 * gib, 2_000_000, 64)  # a 40 GiB card, 2M rows
    assert chunk * (2_000_000 * 4 + 64 * 12) <= 20 * gib < (chunk + 1) * (2_000_000 * 4 + 64 * 12)
    assert query_chunk_for(80 * gib, 1000, 64) == 65_536  # capped
    assert query_chunk_for(100, 10**9, 64) == 1  # always at least one query


def test_triplet_refresh_mines_clean_negatives(
    trained_tiny_model_dir, paraphrase_corpus, paraphrase_pairs, tmp_path, ray_local
):

    from pipeline.data.normalize import with_text_keys
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.triplets import index_triplets
    from pipeline.mining.negatives import NegativeFilters
    from pipeline.mining.text_keys import normalize_text
    from pipeline.model.folders import load_tokenizer

    texts, groups = paraphrase_corpus
    anchors, positives = paraphrase_pairs
    table, triplets = index_triplets(anchors, positives, None)
    tokenized = with_text_keys(tokenize_table(table, load_tokenizer(trained_tiny_model_dir), 32))
    filters = NegativeFilters(num_negatives=2)
    settings = MinerSettings(
        pooler="mean",
        batch_size=32,
        search=SearchSettings(top_k=32),
        seed=0,
        filters=filters,
    )
    blocks = blocks_of(tokenized)
    miner = HardNegativeMiner(blocks, pack_dir(trained_tiny_model_dir), settings, triplets=triplets)
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    report = miner.refresh(weights, version=1, step=7)
    negatives, metrics = report.negatives, report.metrics
    assert report.plan is None  # the rows keep their order; the negatives are a column beside them
    assert negatives.shape == (len(triplets), 2) and report.version == 1
    text = table.column("text").to_pylist()
    group_of = {normalize_text(t): g for t, g in zip(texts, groups.tolist(), strict=True)}
    same_group = 0
    for i, row in enumerate(negatives):
        forbidden = {normalize_text(text[triplets.anchor[i]]), normalize_text(text[triplets.positive[i]])}
        for j in row[row >= 0]:
            assert normalize_text(text[j]) not in forbidden
            assert j in set(triplets.positive.tolist())  # mined from the positives
            same_group += (
                group_of[normalize_text(text[j])] == group_of[normalize_text(text[triplets.anchor[i]])]
            )
    assert same_group <= 0.05 * (negatives >= 0).sum()
    assert metrics["mining/anchors_short"] == int(((negatives >= 0).sum(axis=1) < 2).sum())
    assert metrics["mining/negative_similarity_mean"] > metrics["mining/random_pair_similarity_mean"]
    # Weights that moved, as after an epoch: some rows' negatives change.
    noise = torch.Generator().manual_seed(0)
    moved = {
        name: w + 0.05 * torch.randn(w.shape, generator=noise) if w.is_floating_point() else w
        for name, w in weights.items()
    }
    again = miner.refresh(moved, version=2, step=9)
    # The share of the rows' negatives replaced, against the column handed back last time.
    churn = float((again.negatives != negatives).mean())
    assert again.metrics["mining/churn"] == pytest.approx(churn) and 0.0 < churn < 1.0
    # With random negatives beside the mined ones, the same weights again change no mined
    # negative: the churn stays 0 though the random column is drawn anew at each version.
    with_random = HardNegativeMiner(
        blocks,
        pack_dir(trained_tiny_model_dir),
        dataclasses.replace(settings, random_negatives=1),
        triplets=triplets,
    )
    first = with_random.refresh(weights, version=1, step=7).negatives
    second = with_random.refresh(weights, version=2, step=9)
    np.testing.assert_array_equal(first[:, :2], negatives)
    assert (second.negatives[:, 2] != first[:, 2]).any()
    assert second.metrics["mining/churn"] == 0.0
    # Given run storage, the miner writes the column there and hands back only its URI: the
    # rank that asked never receives every row; a corpus plan goes the same way.
    stored_miner = HardNegativeMiner(
        blocks,
        pack_dir(trained_tiny_model_dir),
        dataclasses.replace(settings, mined_dir=str(tmp_path)),
        triplets=triplets,
    )
    stored = stored_miner.refresh(weights, version=1, step=7)
    assert stored.negatives is None and stored.plan is None and stored.similarities == {}
    assert stored.mined == f"{tmp_path}/v1-negatives.npz"
    np.testing.assert_array_equal(np.load(stored.mined)["negatives"], negatives)
    # It keeps the rows itself: the next refresh's churn is measured as without storage.
    assert (
        stored_miner.refresh(moved, version=2, step=9).metrics["mining/churn"]
        == again.metrics["mining/churn"]
    )
