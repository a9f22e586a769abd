"""bench.partition_planner's inputs are a refresh's: partitions of whole batches that hold every
row once, and search-like lists (each row itself first, then distinct near rows)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bench.partition_planner import CONFIG, neighbour_lists, partitions_of, plan_all


def test_the_partitions_hold_every_row_once_in_whole_batches_and_plan_into_a_plan_of_every_row():
    from pipeline.config.loading import load_config
    from pipeline.mining.miner_settings import MinerSettings

    settings = replace(MinerSettings.from_config(load_config(CONFIG, [])), partition_rows=1000)
    rows = 5_000
    partitions = partitions_of(rows, settings)
    assert len(partitions) > 1
    assert np.array_equal(np.sort(np.concatenate([p.rows for p in partitions])), np.arange(rows))
    assert all(
        p.sizes.sum() == len(p.rows) and (p.sizes >= settings.batch_size - 1).all() for p in partitions
    )
    k = settings.search.top_k + 1
    lists = [neighbour_lists(p.rows, rows, k, np.random.default_rng(0)) for p in partitions]
    first = lists[0]
    assert first["indices"].shape == (len(partitions[0].rows), k)
    assert np.array_equal(first["indices"][:, 0], partitions[0].rows) and first["duplicate"][:, 0].all()
    assert (np.diff(first["scores"], axis=1) <= 0).all()
    assert all(len(set(row)) >= k - 8 for row in first["indices"][:50])  # near rows, few repeats
    _, plan = plan_all(partitions, lists, settings, ways=1)
    assert np.array_equal(np.sort(plan.rows), np.arange(rows)) and plan.sizes.sum() == rows
