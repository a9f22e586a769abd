"""A corpus refresh planned one partition of near texts at a time: every row once, the epoch's
batch sizes, the batches' neighbourhoods kept, the candidates' counts those of one search over
every row; and the partitions cut at batch bounds, checked against the assignment they cut."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.embedded_texts import EmbeddedTexts
from pipeline.batching.plan import balanced_batch_sizes
from pipeline.data.plan_file import read_plan_file
from pipeline.mining.corpus_partitions import (
    CorpusPartitions,
    RankedRows,
    cut_at_batch_bounds,
    partition_corpus,
    rank_offsets,
)
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.mining.planning import refresh_corpus

CLUSTERS, PER_CLUSTER, BATCH = 4, 300, 16


@pytest.fixture(scope="module")
def clustered():
    """Unit vectors around 4 far-apart centres (each row's cluster beside), every 10th row a
    near copy of the one before it (a likely false negative)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLUSTERS, 16))
    clusters = np.repeat(np.arange(CLUSTERS), PER_CLUSTER)
    rng.shuffle(clusters)  # the clusters interleaved in position order, as a real corpus is
    vectors = centres[clusters] / np.linalg.norm(centres, axis=1)[clusters, None]
    vectors += 0.25 * rng.standard_normal(vectors.shape)
    copies = np.arange(10, len(vectors), 10)
    copies = copies[clusters[copies] == clusters[copies - 1]]
    vectors[copies] = vectors[copies - 1] + 0.01 * rng.standard_normal((len(copies), 16))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32), clusters


def refresh(
    vectors: np.ndarray, partition_rows: int, sampler: str = "knn", seed: int = 0, shards: int = 1, **given
):
    """A corpus refresh of ``vectors`` (``given``: ``mined_dir``, ``version``, ``previous``,
    ``keys``, and ``texts``: the holder of an earlier refresh's, which keeps its batches)."""
    search = SearchSettings(top_k=8, index=IndexSpec("flat"))
    settings = MinerSettings(
        pooler="mean", batch_size=BATCH, seed=seed, search=search, shards=shards,
        filters=NegativeFilters(range_min=0), batch_sampler=sampler, partition_rows=partition_rows,
        mined_dir=given.get("mined_dir"),
    )  # fmt: skip
    texts = given.get("texts") or EmbeddedTexts(vectors, None, search, seed, keys=given.get("keys"))
    previous = given.get("previous")
    return refresh_corpus(
        texts, settings=settings, version=given.get("version", 1),
        previous_version=previous.version if previous is not None else None,
    )  # fmt: skip


def one_cluster_share(plan, clusters: np.ndarray) -> float:
    return float(np.mean([len(set(clusters[b].tolist())) == 1 for b in plan.batches()]))


@pytest.mark.parametrize("sampler", ["knn", "random"])
def test_partitions_plan_every_row_once_in_the_epochs_batches(clustered, sampler):
    vectors, clusters = clustered
    n = len(vectors)
    whole = refresh(vectors, partition_rows=n, sampler=sampler)
    parted = refresh(vectors, partition_rows=PER_CLUSTER, sampler=sampler)
    assert whole.metrics["mining/partitions"] == 1 and parted.metrics["mining/partitions"] == CLUSTERS
    for report in (whole, parted):
        assert np.array_equal(np.sort(report.plan.rows), np.arange(n))
        assert np.array_equal(np.sort(report.plan.sizes), np.sort(balanced_batch_sizes(n, BATCH)))
        assert report.plan.sampler == sampler
    # Every row searched the whole corpus: the candidates' fates are those of one search.
    for key in ("candidates", "kept", "false_negatives_flagged", "top1_similarity_mean"):
        assert parted.metrics[f"mining/{key}"] == pytest.approx(whole.metrics[f"mining/{key}"], rel=1e-6), key
    removed = {k: v for k, v in whole.metrics.items() if k.startswith("mining/removed_")}
    assert removed and {k: parted.metrics[k] for k in removed} == removed
    assert whole.metrics["mining/false_negatives_flagged"] > 0
    assert (
        parted.metrics["mining/false_negative_pairs_in_batches"]
        <= 0.02 * whole.metrics["mining/false_negatives_flagged"]
    )
    # The same refresh plans the same epoch; another seed another.
    again = refresh(vectors, partition_rows=PER_CLUSTER, sampler=sampler)
    assert np.array_equal(again.plan.rows, parted.plan.rows)
    assert not np.array_equal(
        refresh(vectors, partition_rows=PER_CLUSTER, sampler=sampler, seed=1).plan.rows, parted.plan.rows
    )


def test_the_plan_written_a_partition_at_a_time_is_the_whole_plan_and_measured_as_one(clustered, tmp_path):
    """Given run storage, each partition's batches are written as they are planned and the
    shuffle of every batch is applied where the file is read: the plan read back is the one
    handed back without storage, and its churn and in-batch similarities, measured partition
    by partition, are those of the whole plans (computed here pair by pair)."""
    vectors, _ = clustered
    # One holder of the texts, as the miner's shards are: it keeps each row's batch for the churn.
    held = EmbeddedTexts(vectors, None, SearchSettings(top_k=8, index=IndexSpec("flat")), 0)
    first = refresh(vectors, partition_rows=PER_CLUSTER, sampler="random", texts=held)
    in_memory = refresh(
        vectors, partition_rows=PER_CLUSTER, sampler="random", version=2, previous=first, texts=held
    )
    stored = refresh(
        vectors, partition_rows=PER_CLUSTER, sampler="random", version=2, previous=first,
        mined_dir=str(tmp_path), texts=held,
    )  # fmt: skip
    assert stored.plan is None and stored.mined == f"{tmp_path}/v2-plan.parquet"
    assert in_memory.metrics["mining/partitions"] == CLUSTERS
    read = read_plan_file(stored.mined, version=2)
    np.testing.assert_array_equal(read.rows, in_memory.plan.rows)
    np.testing.assert_array_equal(read.sizes, in_memory.plan.sizes)
    assert read.sampler == "random" and read.version == 2
    # The batches were shuffled together: the file holds them partition after partition.
    assert pq.read_table(stored.mined).num_rows == read.num_batches
    assert not np.array_equal(
        pq.read_table(stored.mined).column("rows").combine_chunks().flatten(), read.rows
    )

    def pairs(plan) -> set[tuple[int, int]]:
        return {(int(a), int(b)) for batch in plan.batches() for a in batch for b in batch if a != b}

    new = pairs(read)
    churn = len(new - pairs(first.plan)) / len(new)
    assert stored.metrics["mining/churn"] == pytest.approx(churn) == in_memory.metrics["mining/churn"]
    assert 0.0 < churn < 1.0
    # A holder that does not know the last plan's batches (a shard started since, its node
    # lost) leaves the churn out rather than measure it against nothing.
    assert (
        "mining/churn"
        not in refresh(
            vectors, partition_rows=PER_CLUSTER, sampler="random", version=2, previous=first
        ).metrics
    )
    # Fewer batches than the sample's 2,000: every batch, in the plan's final order.
    expected = np.concatenate(
        [(vectors[b] @ vectors[b].T)[np.triu_indices(len(b), k=1)] for b in read.batches()]
    )
    np.testing.assert_allclose(stored.similarities["mined plan"], expected, rtol=1e-5, atol=1e-6)


def test_partitions_planned_as_tasks_where_the_shards_are_plan_the_same_epoch(clustered, ray_local):
    """With shards, the partitions are planned by Ray tasks (up to one a shard at once) while
    the next are searched: the same batches and the same totals as planned one after another."""
    vectors, _ = clustered
    one_way = refresh(vectors, partition_rows=PER_CLUSTER // 2)
    two_ways = refresh(vectors, partition_rows=PER_CLUSTER // 2, shards=2)
    assert one_way.metrics["mining/partitions"] == 2 * CLUSTERS
    assert np.array_equal(two_ways.plan.rows, one_way.plan.rows)
    assert np.array_equal(two_ways.plan.sizes, one_way.plan.sizes)
    timings = ("mining/index_s", "mining/partition_s", "mining/search_s", "mining/plan_s")
    assert {k: v for k, v in two_ways.metrics.items() if k not in timings} == {
        k: v for k, v in one_way.metrics.items() if k not in timings
    }


def test_partitions_keep_the_neighbourhoods_of_one_plan(clustered):
    """On clusters a partition can hold whole, the knn batches stay in one cluster as often as
    the unpartitioned plan's; random batches almost never do (the independent baseline)."""
    vectors, clusters = clustered
    whole = refresh(vectors, partition_rows=len(vectors))
    parted = refresh(vectors, partition_rows=PER_CLUSTER)
    random = refresh(vectors, partition_rows=len(vectors), sampler="random")
    assert one_cluster_share(random.plan, clusters) < 0.05
    assert one_cluster_share(whole.plan, clusters) > 0.5
    assert one_cluster_share(parted.plan, clusters) >= one_cluster_share(whole.plan, clusters) - 0.05
    # k-means found the clusters: the kept neighbours in another partition are those of the
    # rows moved to a batch bound (random partitions would leave 3 in 4 outside).
    assert parted.metrics["mining/kept_outside_partition"] <= 0.05 * parted.metrics["mining/kept"]
    assert (
        parted.metrics["mining/batch_similarity_mean"] >= whole.metrics["mining/batch_similarity_mean"] - 0.02
    )


def partitions_of(assignment: np.ndarray, sizes: np.ndarray, holders: int) -> list:
    """The partitions cut from ``assignment``, the rows held by ``holders`` consecutive holders
    that each rank their own (as the miner's shards do)."""
    bounds = np.linspace(0, len(assignment), holders + 1).round().astype(int)
    parts = [assignment[bounds[h] : bounds[h + 1]] for h in range(holders)]
    counts = np.stack([np.bincount(part, minlength=7) for part in parts])
    offsets = rank_offsets(counts)
    ranked = [RankedRows(part, bounds[h], offsets[h]) for h, part in enumerate(parts)]

    def rows_between(lo: int, hi: int) -> np.ndarray:
        return np.concatenate([r.between(lo, hi) for r in ranked])

    return list(CorpusPartitions(*cut_at_batch_bounds(counts.sum(axis=0), sizes), sizes, rows_between))


@pytest.mark.parametrize("holders", [1, 3])
def test_partition_edges_move_to_the_nearest_batch_bound(holders):
    rng = np.random.default_rng(3)
    assignment = rng.integers(0, 7, size=2_000).astype(np.int32)
    assignment[assignment == 5] = 4  # an empty cell
    assignment[:3] = 6  # and one of 3 rows: less than half a batch, it goes to its neighbour
    assignment[3:][assignment[3:] == 6] = 2
    sizes = balanced_batch_sizes(len(assignment), 50)
    partitions = partitions_of(assignment, sizes, holders)
    assert np.array_equal(np.sort(np.concatenate([p.rows for p in partitions])), np.arange(len(assignment)))
    assert np.array_equal(np.concatenate([p.sizes for p in partitions]), sizes)
    for p in partitions:
        assert len(p.rows) == p.sizes.sum() and np.all(np.diff(p.rows) > 0)
    # Each partition is its cell, but for at most half a batch at each of its two edges.
    assert len(partitions) == 5
    cells = [c for c in range(7) if (assignment == c).sum() >= 25]
    for p, cell in zip(partitions, cells, strict=True):
        strangers = int((assignment[p.rows] != cell).sum())
        missing = int((assignment == cell).sum()) - (len(p.rows) - strangers)
        assert strangers <= sizes.max() and missing <= sizes.max(), cell
    # The rows taken partition after partition are the rows by cell, then by position: however
    # many hold them, each partition is a consecutive run of that one order.
    order = np.argsort(assignment, kind="stable")
    at = 0
    for p in partitions:
        np.testing.assert_array_equal(p.rows, np.sort(order[at : at + len(p.rows)]))
        at += len(p.rows)


def test_a_corpus_of_one_partition_is_not_cut(clustered):
    vectors, _ = clustered
    sizes = balanced_batch_sizes(len(vectors), BATCH)
    texts = EmbeddedTexts(vectors, None, SearchSettings(top_k=8, index=IndexSpec("flat")), 0)
    (only,) = partition_corpus(texts, sizes=sizes, partition_rows=len(vectors), seed=0)
    assert np.array_equal(only.rows, np.arange(len(vectors))) and np.array_equal(only.sizes, sizes)


def test_a_rows_copies_by_key_are_never_its_candidates(clustered):
    """The keys the texts' holders give decide what is a row's own text: the near copies
    (every 10th row) given their original's key are removed as duplicates (in both
    directions), where distinct keys left them to the relative margin, and no copy is planned
    beside its original."""
    vectors, _ = clustered
    distinct = refresh(vectors, partition_rows=PER_CLUSTER)
    keys = np.arange(len(vectors))
    copies = np.flatnonzero(np.einsum("ij,ij->i", vectors[1:], vectors[:-1]) > 0.99) + 1
    keys[copies] = copies - 1
    same = refresh(vectors, partition_rows=PER_CLUSTER, keys=keys)
    removed = same.metrics["mining/removed_duplicate"] - distinct.metrics["mining/removed_duplicate"]
    assert len(copies) > 10 and removed == 2 * len(copies)
    margin = (
        distinct.metrics["mining/removed_relative_margin"] - same.metrics["mining/removed_relative_margin"]
    )
    assert margin == removed
    batch_of = np.empty(len(vectors), dtype=int)
    for number, batch in enumerate(same.plan.batches()):
        batch_of[batch] = number
    assert not np.any(batch_of[copies] == batch_of[copies - 1])


def test_sizes_that_do_not_cover_the_rows_are_refused():
    from pipeline.batching.sampler_inputs import SamplerInputs

    inputs = SamplerInputs(np.full((10, 2), -1), np.zeros((10, 2)), None, 4, 0, 1, sizes=np.array([4, 4]))
    with pytest.raises(ValueError, match="sum to 8, not the 10 rows"):
        inputs.batch_sizes()
    assert replace(inputs, sizes=None).batch_sizes().tolist() == [4, 3, 3]
