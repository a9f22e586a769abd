"""The miner's refresh with each batch sampler, on a corpus with known paraphrase groups
(groups of 4 near-identical sentences), through the real miner and FAISS."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import blocks_of

from pipeline.batching.registry import SAMPLERS
from pipeline.config.loading import load_config
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.miner import HardNegativeMiner
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import FILTERS, NegativeFilters
from pipeline.mining.random_negatives import random_pool_negatives
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import pack_dir


@pytest.fixture(scope="module")
def refresh(trained_tiny_model_dir, tokenized_corpus, ray_local):
    """``refresh(plan_settings) -> RefreshReport`` of the real miner on the paraphrase corpus."""
    table, _ = tokenized_corpus
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    blob = pack_dir(trained_tiny_model_dir)
    blocks = blocks_of(table)

    def run(batch_sampler: str, seed: int = 11):
        settings = MinerSettings(
            pooler="mean",
            batch_size=16,
            search=SearchSettings(top_k=32),
            seed=seed,
            batch_sampler=batch_sampler,
        )
        return HardNegativeMiner(blocks, blob, settings).refresh(weights, version=1, step=0)

    return run


def _same_group_share(plan, groups):
    """Share of in-batch pairs that are paraphrases (same group)."""
    together = total = 0
    for rows in plan.batches():
        g = groups[rows]
        together += int((g[:, None] == g[None, :]).sum() - len(rows))
        total += len(rows) * (len(rows) - 1)
    return together / total


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_plans_a_safe_epoch_and_records_itself(refresh, tokenized_corpus, sampler):
    table, groups = tokenized_corpus
    n = table.num_rows
    report = refresh(sampler)
    plan, metrics = report.plan, report.metrics
    assert plan.sampler == sampler
    assert sorted(plan.rows.tolist()) == list(range(n))
    assert plan.sizes.max() - plan.sizes.min() <= 1
    # Flagged false negatives (each row's nearest, its paraphrases here) stay apart...
    assert (
        metrics["mining/false_negative_pairs_in_batches"] <= 0.02 * metrics["mining/false_negatives_flagged"]
    )
    # ...so paraphrases rarely share a batch, whatever the sampler (random: 3 of 1199 by chance).
    assert _same_group_share(plan, groups) <= 0.01
    if sampler == "random":
        assert metrics["mining/batch_similarity_mean"] == pytest.approx(
            metrics["mining/random_batch_similarity_mean"], abs=0.05
        )
    else:
        assert metrics["mining/batch_similarity_mean"] > metrics["mining/random_batch_similarity_mean"]
    # Deterministic for a seed, different for another.
    assert np.array_equal(refresh(sampler).plan.rows, plan.rows)
    assert not np.array_equal(refresh(sampler, seed=12).plan.rows, plan.rows)


def test_the_batch_sampler_comes_from_the_config():
    cfg = load_config(overrides=["mining.batch_sampler=knn"])
    assert MinerSettings.from_config(cfg).batch_sampler == "knn"


def test_triplet_refresh_mixes_random_negatives_and_counts_each_filter(
    trained_tiny_model_dir, paraphrase_corpus, paraphrase_pairs, ray_local
):
    from conftest import text_keys

    from pipeline.data.normalize import with_text_keys
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.triplets import index_triplets
    from pipeline.model.folders import load_tokenizer

    anchors, positives = paraphrase_pairs
    table, triplets = index_triplets(anchors, positives, None)
    tokenized = with_text_keys(tokenize_table(table, load_tokenizer(trained_tiny_model_dir), 32))
    settings = MinerSettings(
        pooler="mean", batch_size=32, search=SearchSettings(top_k=32), seed=0,
        filters=NegativeFilters(num_negatives=2), random_negatives=1,
    )  # fmt: skip
    miner = HardNegativeMiner(
        blocks_of(tokenized), pack_dir(trained_tiny_model_dir), settings, triplets=triplets
    )
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    report = miner.refresh(weights, version=1, step=0)
    negatives, metrics = report.negatives, report.metrics
    assert negatives.shape == (len(triplets), 3)  # 2 mined + 1 random
    (keys,) = text_keys(table.column("text").to_pylist())
    drawn = negatives[:, 2]
    assert (drawn >= 0).all()
    assert (
        not (keys[drawn] == keys[triplets.anchor]).any()
        and not (keys[drawn] == keys[triplets.positive]).any()
    )
    # Random draws are far less similar to the anchor than mined ones: they are not mined twice.
    assert (drawn != negatives[:, 0]).mean() > 0.9
    # Candidates left after each filter, in order, end at what was kept; the selection is within it.
    passed = [metrics[f"mining/passed_{name}"] for name in FILTERS]
    assert passed == sorted(passed, reverse=True) and passed[0] <= metrics["mining/candidates"]
    assert passed[-1] == metrics["mining/kept"] >= metrics["mining/selected"] == (negatives[:, :2] >= 0).sum()
    assert metrics["mining/random_negatives"] == len(triplets)


def test_random_pool_negatives_avoid_the_anchor_and_positive_and_are_seeded():
    keys = np.array([0, 1, 2, 3, 4, 5, 0, 1])  # texts 6 and 7 repeat texts 0 and 1
    anchor, positive = np.array([0, 2, 4]), np.array([1, 3, 5])
    pool = np.array([1, 3, 5, 6, 7])
    drawn = random_pool_negatives(keys, anchor, positive, pool=pool, count=4, seed=3)
    assert drawn.shape == (3, 4)
    for i in range(3):
        for j in drawn[i]:
            assert j in pool and keys[j] not in (keys[anchor[i]], keys[positive[i]])
    assert np.array_equal(drawn, random_pool_negatives(keys, anchor, positive, pool=pool, count=4, seed=3))
