"""The miner's re-encode fanned out over a Ray Data actor pool equals the in-process encode."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.miner import HardNegativeMiner
from pipeline.mining.miner_settings import MinerSettings
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import pack_dir

pytestmark = pytest.mark.slow


def test_actor_pool_encode_matches_in_process(ray_local, trained_tiny_model_dir, tokenized_corpus):
    table, _ = tokenized_corpus
    weights = load_sentence_encoder(trained_tiny_model_dir, pooler="mean").encoder.state_dict()
    blob = pack_dir(trained_tiny_model_dir)
    settings = MinerSettings(pooler="mean", batch_size=16, search=SearchSettings(top_k=32), seed=0)
    local = HardNegativeMiner(table, blob, settings).encode(weights)
    pooled_miner = HardNegativeMiner(table, blob, replace(settings, encode_actors=2, num_cpus=0.5))
    pooled = pooled_miner.encode(weights)
    assert pooled.shape == local.shape == (table.num_rows, 32)
    assert np.abs(pooled - local).max() < 1e-5  # every row back in its place
    report = pooled_miner.refresh(weights, version=1, step=0)
    assert sorted(report.plan.rows.tolist()) == list(range(table.num_rows))
