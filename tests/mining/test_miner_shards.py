"""The miner's shards as Ray actors (pipeline/mining/miner_shards.py): each encodes its range
of the corpus, and the merged search over them is exactly one flat index over the same vectors."""

from __future__ import annotations

import os

import faiss
import numpy as np
import pytest

from pipeline.data.tokenized import TokenizedCorpus
from pipeline.mining.corpus_partitions import rank_offsets
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import (
    IndexSpec,
    PretrainedIndex,
    VectorIndex,
    index_over_cells,
    ivf_cells,
    training_rows,
)
from pipeline.mining.miner_shard import shard_ranges
from pipeline.mining.miner_shards import MinerShards
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import pack_dir


def in_tie_order(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each query's rows ordered by score, then by row: one order for equal scores."""
    order = np.lexsort((rows, -scores), axis=1)
    return np.take_along_axis(rows, order, axis=1)


def assert_same_neighbours(found: tuple[np.ndarray, np.ndarray], one: tuple[np.ndarray, np.ndarray]) -> None:
    """The same neighbours with the same scores; among exactly tied scores (texts the
    truncation made identical) each index orders as it will, and where the tie spans the k-th
    place each keeps its own of the tied rows. Rows of -1 (fewer found) score -inf."""
    (scores, rows), (one_scores, one_rows) = found, one
    one_scores = np.where(one_rows >= 0, one_scores, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(scores, one_scores)
    above_cut = scores > scores[:, -1:]
    np.testing.assert_array_equal(
        np.where(above_cut, in_tie_order(scores, rows), -1),
        np.where(above_cut, in_tie_order(one_scores, one_rows), -1),
    )
    assert (rows == one_rows).mean() > 0.9


def cosine_to_nearest(vectors: np.ndarray, centroids: np.ndarray) -> float:
    """Mean cosine of each vector to its nearest centroid: what spherical k-means maximises."""
    return float((vectors @ centroids.T).max(axis=1).mean())


def test_shard_ranges_cover_the_corpus_and_number_the_candidates_in_order():
    pool = np.array([0, 3, 4, 9, 10, 11, 19])
    spans = shard_ranges(20, pool, 3)
    assert [(s.first, s.last) for s in spans] == [(0, 7), (7, 13), (13, 20)]
    assert [s.candidates.tolist() for s in spans] == [[0, 3, 4], [9, 10, 11], [19]]
    assert [s.first_candidate for s in spans] == [0, 3, 6]
    assert [len(s.candidates) for s in shard_ranges(5, None, 2)] == [2, 3]


@pytest.mark.parametrize(("shards", "every"), [(1, 2), (3, 2), (3, 1)])
def test_sharded_encode_and_search_equal_one_process_and_one_flat_index(
    sorted_blocks, tiny_model_dir, shards, every
):
    """``every``: 2, every other text is a candidate (the shard keeps its texts' vectors); 1,
    every text is (the shard's index holds the only copy, and gives them back)."""
    blocks, _, tokenizer = sorted_blocks
    model = load_sentence_encoder(tiny_model_dir, pooler="mean")
    state = model.encoder.state_dict()
    whole = TokenizedCorpus(blocks.table(), tokenizer.pad_token_id)
    import torch

    expected = encode_rows(model, whole, np.arange(len(whole)), batch_size=64, device=torch.device("cpu"))
    pool = np.arange(0, blocks.num_rows, every)
    search = SearchSettings(top_k=10, index=IndexSpec("flat"))
    miner_shards = MinerShards.start(
        blocks, pack_dir(tiny_model_dir), pooler="mean", candidates=pool, shards=shards, search=search,
        actor_options={"num_cpus": 0.1},
    )  # fmt: skip
    try:
        reports = miner_shards.encode(state, seed=0)
        assert sum(r["rows"] for r in reports) == len(pool) == miner_shards.rows
        vectors = miner_shards.vectors(np.arange(len(whole)))
        np.testing.assert_allclose(vectors, expected, atol=1e-5)  # the same encoder, batched apart
        queries = miner_shards.vectors(np.arange(0, len(whole), 3))
        scores, ordinals = miner_shards.search(queries, 10)
        one = faiss.knn(queries, vectors[pool], 10, faiss.METRIC_INNER_PRODUCT)
        assert_same_neighbours((scores, ordinals), one)
        np.testing.assert_allclose(
            np.einsum("qkd,qd->qk", vectors[pool][ordinals], queries), scores, atol=1e-5
        )
        # The same search with the queries left where they are held (never through this process).
        by_position = miner_shards.search_positions(np.arange(0, len(whole), 3), 10)
        np.testing.assert_array_equal(by_position[0], scores)
        np.testing.assert_array_equal(by_position[1], ordinals)
        # Pairs scored where their left texts are, the right ones' vectors sent there.
        left, right = np.arange(len(whole)), np.arange(len(whole))[::-1].copy()
        np.testing.assert_allclose(
            miner_shards.pair_scores(left, right), (vectors[left] * vectors[right]).sum(axis=1), atol=1e-6
        )
        # Every text assigned to its nearest centroid where its vector is; only the counts come
        # back, and each cell's texts are then fetched from the shards as one run of ranks.
        centroids = vectors[pool][:7] * 2.0  # any 7 directions; they are normalised there
        units = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
        counts = miner_shards.cell_counts(centroids)
        assert counts.shape == (shards, 7) and counts.sum() == len(whole)
        miner_shards.order_by_cell(rank_offsets(counts))
        bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
        cells = [miner_shards.rows_ranked(int(bounds[c]), int(bounds[c + 1])) for c in range(7)]
        np.testing.assert_array_equal(np.sort(np.concatenate(cells)), np.arange(len(whole)))
        for cell, rows in enumerate(cells):
            assert np.all(np.diff(rows) > 0)
            np.testing.assert_allclose(
                vectors[rows] @ units[cell], (vectors[rows] @ units.T).max(axis=1), atol=1e-6
            )
        # Each text's key, from the shard that holds it, as the corpus' blocks give it.
        asked = np.random.default_rng(0).integers(0, len(whole), 50)
        np.testing.assert_array_equal(
            miner_shards.keys_of(asked), blocks.table().column("text_key").to_numpy()[asked]
        )
        # Each text's batch kept where it is held: a refresh's record answers the last one's.
        rng = np.random.default_rng(1)
        shuffled, half = rng.permutation(len(whole)), rng.permutation(len(whole))[: len(whole) // 2]
        first, second = (rng.integers(0, 40, len(whole)).astype(np.int32) for _ in range(2))
        unknown = miner_shards.record_batches(shuffled, first[shuffled], version=1, previous=None)
        assert unknown.dtype == np.int32 and (unknown == -1).all()
        np.testing.assert_array_equal(
            miner_shards.record_batches(half, second[half], version=2, previous=1), first[half]
        )
        # The third refresh answers the second's (texts it has not planned: -1); the first's is gone.
        everyone = np.arange(len(whole))
        expected_second = np.full(len(whole), -1, dtype=np.int32)
        expected_second[half] = second[half]
        np.testing.assert_array_equal(
            miner_shards.record_batches(everyone, first, version=3, previous=2), expected_second
        )
        assert (miner_shards.record_batches(everyone, first, version=4, previous=1) == -1).all()
        assert miner_shards.backend == "faiss-cpu/flat" + (f" x{shards}" if shards > 1 else "")
        # One shard is the same code in this process (the miner's), more are actors of their own.
        pids = miner_shards.ask_all("ready")
        assert (
            (pids == [os.getpid()]) if shards == 1 else (len(set(pids)) == shards and os.getpid() not in pids)
        )
    finally:
        miner_shards.stop()


@pytest.mark.parametrize("shards", [1, 3])
def test_ivf_shards_list_under_cells_trained_over_all_and_search_as_one_ivf_index(
    sorted_blocks, tiny_model_dir, shards, capsys
):
    """The cells are trained once on a sample drawn over every shard (a k-means whose rounds
    each shard assigns its own part of), each shard lists its vectors under them, and one nprobe
    is calibrated for all: at any nprobe the merged search is one IVF index's over the same
    vectors under the same cells, and the cells are as good as one process' k-means of the
    sample."""
    blocks, _, _ = sorted_blocks
    state = load_sentence_encoder(tiny_model_dir, pooler="mean").encoder.state_dict()
    miner_shards = MinerShards.start(
        blocks, pack_dir(tiny_model_dir), pooler="mean", candidates=None, shards=shards,
        search=SearchSettings(top_k=10, index=IndexSpec("ivf")), actor_options={"num_cpus": 0.1},
    )  # fmt: skip
    try:
        miner_shards.encode(state, seed=3)
        rows = miner_shards.rows
        vectors = miner_shards.vectors(np.arange(rows))  # read back from the shards' lists
        sample = training_rows(rows, "ivf", seed=3)
        cells = ivf_cells(rows)
        centroids = miner_shards.centroids
        assert centroids.shape == (cells, vectors.shape[1])
        alone = faiss.Kmeans(vectors.shape[1], cells, niter=10, seed=3, spherical=True)
        alone.train(vectors[sample])  # faiss' own k-means of the sample, in one process
        alone = alone.centroids
        assert cosine_to_nearest(vectors, centroids) >= cosine_to_nearest(vectors, alone) - 0.01
        trained = index_over_cells(centroids, "ivf")
        one = VectorIndex(
            vectors, spec=IndexSpec("ivf"), pretrained=PretrainedIndex(trained, sample, vectors[sample])
        )
        assert 1 <= miner_shards.nprobe <= cells
        out = capsys.readouterr().out
        each = ", each shard assigning its own" if shards > 1 else ""
        assert f"{cells:,} ivf cells trained on {len(sample):,} rows{each}:" in out
        common = " in common" if shards > 1 else ""
        assert f"{cells:,} cells{common}: nprobe {miner_shards.nprobe:,}" in out
        queries = vectors[::2]
        for nprobe in (1, 2, miner_shards.nprobe):
            miner_shards.set_nprobe(nprobe)
            one.set_nprobe(nprobe)
            assert_same_neighbours(miner_shards.search(queries, 10), one.search(queries, 10))
        assert miner_shards.backend == "faiss-cpu/ivf" + (f" x{shards}" if shards > 1 else "")
    finally:
        miner_shards.stop()


def test_a_lost_shard_is_replaced_at_the_next_encode(sorted_blocks, tiny_model_dir, capsys):
    """A shard actor killed between refreshes (as its node would lose it): the next encode
    starts a new one over the same range, and the vectors are those of the shards before."""
    import ray

    blocks, _, _ = sorted_blocks
    state = load_sentence_encoder(tiny_model_dir, pooler="mean").encoder.state_dict()
    miner_shards = MinerShards.start(
        blocks, pack_dir(tiny_model_dir), pooler="mean", candidates=None, shards=2,
        search=SearchSettings(top_k=5, index=IndexSpec("flat")), actor_options={"num_cpus": 0.1},
    )  # fmt: skip
    try:
        miner_shards.encode(state, seed=0)
        before = miner_shards.vectors(np.arange(blocks.num_rows))
        everyone = np.arange(blocks.num_rows)
        batches = (everyone // 4).astype(np.int32)
        miner_shards.record_batches(everyone, batches, version=1, previous=None)
        lost = miner_shards.handles[1]
        ray.kill(lost, no_restart=True)
        span = miner_shards.spans[1]
        # A refresh that searches after the loss fails with a line naming the shard...
        with pytest.raises(
            ray.exceptions.RayActorError,
            match=rf"miner shard 1 \(rows {span.first}-{span.last - 1}\) was lost",
        ):
            miner_shards.search(before[:4], 5)
        # ... and the one submitted again replaces it.
        miner_shards.encode(state, seed=0)
        assert miner_shards.handles[1] is not lost and miner_shards.handles[0] is not None
        np.testing.assert_allclose(miner_shards.vectors(np.arange(blocks.num_rows)), before, atol=1e-6)
        # The new shard never knew the last plan: its rows' batches are unknown, the other's kept.
        earlier = miner_shards.record_batches(everyone, batches, version=2, previous=1)
        kept = everyone < span.first
        np.testing.assert_array_equal(earlier[kept], batches[kept])
        assert (earlier[~kept] == -1).all()
        assert f"[mining] shard 1 (rows {span.first}-{span.last - 1}) was lost" in capsys.readouterr().out
    finally:
        miner_shards.stop()


def test_a_shard_that_ray_killed_for_memory_is_replaced_as_a_lost_one(ray_local, capsys):
    """Ray's memory monitor ends a worker with OutOfMemoryError, which is not an actor error:
    the shard's range still gets a new shard, as for one lost with its node."""
    ray = ray_local

    class Answering:  # local: pickled by value, since workers cannot import test modules
        """Answers as a shard does, or fails as a shard the memory monitor killed."""

        def __init__(self, killed: bool):
            self.killed = killed

        def ready(self) -> int:
            if self.killed:
                raise ray.exceptions.OutOfMemoryError(
                    "1 worker(s) were killed due to the node running low on memory"
                )
            return 7

    spans = shard_ranges(10, None, 2)
    actor = ray.remote(Answering)
    shards = MinerShards(
        [actor.remote(False), actor.remote(True)], spans, lambda span: actor.remote(False),
        SearchSettings(index=IndexSpec("flat")),
    )  # fmt: skip
    assert shards._ask_every("ready", lambda number: ()) == [7, 7]
    out = capsys.readouterr().out
    assert "[mining] shard 1 (rows 5-9) was lost (" in out and "running low on memory" in out
