"""The miner over shard actors (``mining.shards: 2``) refreshes as the miner whose one shard
runs in its own process (``mining.shards: 1``). The shards encode their ranges in batches of their own, so their vectors equal the
miner's to float rounding (tested exactly on the same vectors in test_miner_shards.py); here
the pairs column and the corpus plan's quality are compared."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec
from pipeline.mining.miner import HardNegativeMiner
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import pack_dir

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("task", ["corpus", "pairs"])
def test_two_shards_refresh_as_one_miner(sorted_blocks, trained_tiny_model_dir, task):
    from pipeline.data.triplets import Triplets

    blocks, _, _ = sorted_blocks
    n = blocks.num_rows
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    blob = pack_dir(trained_tiny_model_dir)
    settings = MinerSettings(
        pooler="mean", batch_size=16, seed=0, search=SearchSettings(top_k=16, index=IndexSpec("flat")),
        filters=NegativeFilters(range_min=1, num_negatives=2, relative_margin=None),
        batch_sampler="knn",
        num_cpus=0.1,
    )  # fmt: skip
    triplets = None
    if task == "pairs":  # every text's neighbour in position order as its positive; half the texts as pool
        rows = np.arange(0, n - 1, 2)
        triplets = Triplets(rows, rows + 1, np.full(len(rows), -1), pool=np.arange(1, n, 2))
    one = HardNegativeMiner(blocks, blob, settings, triplets=triplets).refresh(weights, version=1, step=0)
    sharded = HardNegativeMiner(blocks, blob, replace(settings, shards=2), triplets=triplets)
    try:
        two = sharded.refresh(weights, version=1, step=0)
    finally:
        sharded.shards.stop()
    if task == "pairs":
        assert (one.negatives >= 0).mean() > 0.9
        assert (two.negatives == one.negatives).mean() > 0.95
    else:
        assert np.array_equal(np.sort(two.plan.rows), np.arange(n))  # every row once
        np.testing.assert_array_equal(np.sort(two.plan.sizes), np.sort(one.plan.sizes))
        for key in ("mining/batch_similarity_mean", "mining/top1_similarity_mean"):
            assert abs(two.metrics[key] - one.metrics[key]) < 0.01, key
        assert (
            two.metrics["mining/batch_similarity_mean"] > two.metrics["mining/random_batch_similarity_mean"]
        )
    for key in ("mining/corpus_size", "mining/candidates"):
        assert two.metrics[key] == one.metrics[key], key


def test_the_teacher_scores_in_each_shard_as_it_does_in_one(sorted_blocks, trained_tiny_model_dir, tmp_path):
    """``mining.teacher`` with ``mining.shards: 2``: each shard actor loads the teacher where it
    encodes and scores a part of the pairs, none in the miner's process, and the denoised
    column and the teacher's scores are those of the one in-process shard (to bf16's rounding,
    where the CPU computes bf16: the parts batch the texts otherwise). A shard leaves no copy
    of the model it was sent in its node's temp folder."""
    import ray

    from pipeline.data.text_blocks import DistinctTexts
    from pipeline.data.triplets import Triplets
    from pipeline.mining.miner_shards import InProcessShard
    from pipeline.model.teacher import TeacherSettings

    blocks, table, _ = sorted_blocks
    n = blocks.num_rows
    texts = DistinctTexts(ids=table.column("id").to_numpy(), blocks=[ray.put(table)])
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    blob = pack_dir(trained_tiny_model_dir)
    rows = np.arange(0, n - 1, 2)
    triplets = Triplets(rows, rows + 1, np.full(len(rows), -1), pool=np.arange(1, n, 2))
    # A margin wide enough that the teacher (the student's own weights) drops some negatives and
    # rows are refilled from deeper in their window of 6.
    settings = MinerSettings(
        pooler="mean", batch_size=16, seed=0, search=SearchSettings(top_k=16, index=IndexSpec("flat")),
        filters=NegativeFilters(range_min=1, num_negatives=6, relative_margin=None),
        num_cpus=0.1, teacher=TeacherSettings(str(trained_tiny_model_dir), max_seq_len=16, batch_size=16),
        denoise_margin=0.2, keep_negatives=2,
    )  # fmt: skip
    node_temp = tmp_path / "temp"
    node_temp.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tempfile.tempdir", str(node_temp))
        local = HardNegativeMiner(blocks, blob, settings, triplets=triplets, texts=texts)
    assert list(node_temp.iterdir()) == []  # the shard loaded its model and removed the unpacked copy
    (shard,) = local.shards.handles
    assert isinstance(shard, InProcessShard) and shard.shard.teacher is not None
    one = local.refresh(weights, version=1, step=0)
    # The same weights again: the same pairs, every one answered by the teacher's cache.
    again = local.refresh(weights, version=2, step=0)
    assert again.metrics["mining/teacher_pairs"] == one.metrics["mining/teacher_pairs"] > 0
    assert again.metrics["mining/teacher_computed"] == 0 < one.metrics["mining/teacher_computed"]
    sharded = HardNegativeMiner(
        blocks, blob, replace(settings, shards=2), triplets=triplets, texts=texts, teacher_blob=ray.put(blob)
    )
    try:
        two = sharded.refresh(weights, version=1, step=0)
        # The teacher lives in the shard actors, where the vectors are, and each scored a part.
        loaded = [h.__ray_call__.remote(lambda s: s.teacher is not None) for h in sharded.shards.handles]
        assert ray.get(loaded) == [True, True]
    finally:
        sharded.shards.stop()
    assert one.metrics["mining/teacher_denoised"] > 0
    # Each shard encodes the texts of its own part: a text in both parts is encoded by both.
    assert two.metrics["mining/teacher_computed"] >= one.metrics["mining/teacher_computed"]
    assert one.negatives.shape == two.negatives.shape == (len(rows), 2)
    same = (two.negatives == one.negatives).all(axis=1)
    assert same.mean() > 0.9
    np.testing.assert_allclose(two.teacher_scores[same], one.teacher_scores[same], atol=3e-3)
    assert two.metrics["mining/teacher_denoised"] == pytest.approx(
        one.metrics["mining/teacher_denoised"], rel=0.1
    )
