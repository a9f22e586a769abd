"""Sharded search (the shards' top lists merged by faiss, ``index.merge_top_k``; IVF shards under
shared cells, ``miner_shards.shared_sample``, one ``index.calibrate_nprobe`` for them all) against
one FAISS index over the same vectors."""

from collections.abc import Sequence

import faiss
import numpy as np
import pytest

from bench.embedded_texts import EmbeddedTexts, mine_hard_negatives
from pipeline.mining.index import (
    IndexSpec,
    PretrainedIndex,
    VectorIndex,
    calibrate_nprobe,
    index_over_cells,
    ivf_cells,
    merge_top_k,
)
from pipeline.mining.ivf_training import SampleOnDevice, spherical_kmeans
from pipeline.mining.miner_shards import shared_sample


class ShardsInProcess:
    """Indexes over consecutive slices of the rows, in this process, searched as one as the
    miner's shards are (``MinerShards``, ``MinerShard._numbered``): every query on every
    shard, each shard's rows numbered after the slices before it, the top lists merged."""

    def __init__(self, shards: Sequence[tuple[int, VectorIndex]]):
        self.shards = list(shards)
        self.rows = sum(index.rows for _, index in self.shards)
        self.backend = f"{self.shards[0][1].backend} x{len(self.shards)}"
        self.build_seconds = 0.0

    def _merged(self, method: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.rows)
        parts = []
        for first, index in self.shards:
            scores, rows = getattr(index, method)(queries, k)
            parts.append((scores, np.where(rows >= 0, rows + first, -1)))
        return merge_top_k(parts, k)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._merged("search", queries, k)

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._merged("exact_search", queries, k)

    def set_nprobe(self, nprobe: int) -> None:
        for _, index in self.shards:
            index.set_nprobe(nprobe)


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def shards_of(vectors: np.ndarray, bounds: list[int]) -> ShardsInProcess:
    edges = [0, *bounds, len(vectors)]
    return ShardsInProcess(
        [
            (lo, VectorIndex(vectors[lo:hi], spec=IndexSpec("flat")))
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ]
    )


@pytest.mark.parametrize("bounds", [[], [500], [7, 400, 401]])  # 1, 2 and 4 shards, one of a single row
def test_sharded_flat_search_equals_one_flat_index(bounds: list[int]) -> None:
    vectors, queries = unit_vectors(1000, 24, 0), unit_vectors(300, 24, 1)
    whole_scores, whole_rows = faiss.knn(queries, vectors, 16, faiss.METRIC_INNER_PRODUCT)
    scores, rows = shards_of(vectors, bounds).search(queries, 16)
    np.testing.assert_array_equal(rows, whole_rows)
    np.testing.assert_array_equal(scores, whole_scores)  # the same dot products, bit for bit


def test_every_row_against_the_corpus_finds_itself_first_across_shards() -> None:
    vectors = unit_vectors(600, 16, 2)
    scores, rows = shards_of(vectors, [250]).search(vectors, 5)
    np.testing.assert_array_equal(rows[:, 0], np.arange(600))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)


def test_merge_pads_when_the_shards_hold_fewer_rows_than_k() -> None:
    scores = np.array([[0.9, 0.1]], dtype=np.float32)
    merged_scores, merged_rows = merge_top_k(
        [(scores, np.array([[4, 5]])), (np.array([[0.5]], np.float32), np.array([[9]]))], 4
    )
    np.testing.assert_array_equal(merged_rows, [[4, 9, 5, -1]])
    np.testing.assert_array_equal(merged_scores, np.array([[0.9, 0.5, 0.1, -np.inf]], np.float32))


def test_mining_over_shards_gives_the_one_index_negatives_column() -> None:
    """The pairs task's column of negatives, the filters and their counts: the same whether the
    pool is one flat index or three shards of it."""
    from pipeline.mining.hard_negatives import SearchSettings
    from pipeline.mining.negatives import NegativeFilters

    rng = np.random.default_rng(3)
    pool = unit_vectors(800, 16, 4)
    positives = pool[rng.integers(0, 800, size=200)]
    anchors = positives + 0.4 * unit_vectors(200, 16, 5)  # near their positives: the margin keeps most
    anchors /= np.linalg.norm(anchors, axis=1, keepdims=True)
    pool_keys = np.arange(800) % 700  # some texts repeated: the duplicate filter has work
    anchor_keys, positive_keys = rng.integers(0, 900, size=200), rng.integers(0, 800, size=200) % 700
    search = SearchSettings(top_k=32, index=IndexSpec("flat"))
    filters = NegativeFilters(range_min=2, num_negatives=3, relative_margin=0.05)

    def mined(pool_vectors):  # noqa: ANN001, ANN202
        return mine_hard_negatives(
            anchor_vectors=anchors, positive_vectors=positives, pool_vectors=pool_vectors,
            anchor_keys=anchor_keys, positive_keys=positive_keys, pool_keys=pool_keys,
            filters=filters, search=search, seed=0,
        )  # fmt: skip

    whole, sharded = mined(pool), mined(shards_of(pool, [100, 450]))
    assert (whole.negatives >= 0).sum() > 400  # most anchors found their three
    np.testing.assert_array_equal(sharded.negatives, whole.negatives)
    np.testing.assert_array_equal(sharded.scores, whole.scores)
    assert sharded.table.drop_columns(["negatives", "scores"]).equals(
        whole.table.drop_columns(["negatives", "scores"])
    )
    assert sharded.backend == "faiss-cpu/flat x3"


class ShardedTexts(EmbeddedTexts):
    """Every text's vector, with the pool searched as three in-process shards."""

    def __init__(self, embeddings: np.ndarray, pool: np.ndarray):
        self.embeddings = embeddings
        self.index = shards_of(embeddings[pool], [len(pool) // 5, len(pool) // 2])
        self.rows, self.backend, self.build_seconds = self.index.rows, self.index.backend, 0.0
        self.kind, self.dim = "flat", embeddings.shape[1]


def test_a_pairs_refresh_in_chunks_and_over_shards_gives_the_one_index_column() -> None:
    """The negatives column does not depend on how many rows are mined at once nor on how the
    pool is sharded, and a known positive in another chunk's row is still no negative."""
    from pipeline.data.triplets import Triplets
    from pipeline.mining.hard_negatives import SearchSettings
    from pipeline.mining.miner_settings import MinerSettings
    from pipeline.mining.negatives import NegativeFilters
    from pipeline.mining.pair_refresh import refresh_pairs

    rng = np.random.default_rng(7)
    texts = unit_vectors(500, 16, 8)
    anchor = rng.integers(0, 100, size=300)  # anchor texts repeat: each has several positives
    positive = rng.integers(100, 500, size=300)
    texts[positive] = texts[anchor] + 0.3 * texts[positive]  # positives near their anchors
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    triplets = Triplets(anchor, positive, np.full(300, -1))
    keys = np.arange(500)
    settings = MinerSettings(
        pooler="mean", batch_size=8, seed=0, search=SearchSettings(top_k=24, index=IndexSpec("flat")),
        filters=NegativeFilters(range_min=0, num_negatives=3, relative_margin=None),
    )  # fmt: skip
    pool = triplets.candidate_pool()

    def column(source, chunk_rows: int) -> np.ndarray:  # noqa: ANN001
        report = refresh_pairs(source, triplets=triplets, keys=keys, settings=settings, version=1,
                               previous_negatives=None, chunk_rows=chunk_rows)  # fmt: skip
        return report.negatives

    whole = column(EmbeddedTexts(texts, pool, settings.search, seed=1), 10**6)
    assert (whole >= 0).mean() > 0.9
    assert whole.dtype == np.int32  # text positions below 2^31
    for got in (
        column(EmbeddedTexts(texts, pool, settings.search, seed=1), 37),
        column(ShardedTexts(texts, pool), 37),
    ):
        np.testing.assert_array_equal(got, whole)
    # No row's negative is a positive of any row with the same anchor text.
    known = {(a, p) for a, p in zip(anchor.tolist(), positive.tolist(), strict=True)}
    assert not any(
        (a, n) in known for a, row in zip(anchor.tolist(), whole.tolist(), strict=True) for n in row
    )


def clustered_vectors(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(clusters, size=n)] + 0.3 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def shared_cell_shards(
    vectors: np.ndarray, bounds: list[int], kind: str, seed: int
) -> tuple[ShardsInProcess, VectorIndex]:
    """IVF shards over slices of ``vectors`` with cells trained on a sample drawn over them all,
    and one index over every row filled from the same trained index."""
    edges = [0, *bounds, len(vectors)]
    parts = shared_sample(edges[:-1], len(vectors), seed=seed)
    sample = np.concatenate([part + lo for part, lo in zip(parts, edges, strict=False)])
    cells = spherical_kmeans(SampleOnDevice(vectors[sample], "cpu"), ivf_cells(len(vectors)), seed=seed)
    trained = index_over_cells(cells, kind, vectors[sample])
    shards = ShardsInProcess(
        [
            (
                lo,
                VectorIndex(
                    vectors[lo:hi],
                    spec=IndexSpec(kind),
                    pretrained=PretrainedIndex(trained, part, vectors[lo:hi][part]),
                ),
            )
            for lo, hi, part in zip(edges[:-1], edges[1:], parts, strict=True)
        ]
    )
    one = VectorIndex(
        vectors, spec=IndexSpec(kind), pretrained=PretrainedIndex(trained, sample, vectors[sample])
    )
    return shards, one


@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
@pytest.mark.parametrize("bounds", [[1_200], [300, 1_500, 2_900]])  # 2 and 4 shards
def test_ivf_shards_over_shared_cells_search_as_one_ivf_index(kind: str, bounds: list[int]) -> None:
    """The same cells listing the same vectors: at any nprobe, the sharded search finds what one
    index over all the rows finds, with the same scores (IVF-PQ: the same codes)."""
    vectors, queries = clustered_vectors(3_000, 16, 40, 4), clustered_vectors(200, 16, 40, 5)
    shards, one = shared_cell_shards(vectors, bounds, kind, seed=7)
    assert one.rows == shards.rows == 3_000
    for nprobe in (1, 3, 8):
        shards.set_nprobe(nprobe)
        one.set_nprobe(nprobe)
        scores, rows = shards.search(queries, 10)
        one_scores, one_rows = one.search(queries, 10)
        # Where a query's probed cells hold fewer than 10 rows, faiss pads with -1 (and a
        # score of -FLT_MAX, the merge -inf).
        np.testing.assert_array_equal(scores, np.where(one_rows >= 0, one_scores, -np.inf))
        np.testing.assert_array_equal(rows, one_rows)
    # Fewer probes find fewer of the exact neighbours: the nprobe set is the one searched.
    _, exact = shards.exact_search(queries, 10)
    recall = {}
    for nprobe in (1, 8):
        shards.set_nprobe(nprobe)
        found = shards.search(queries, 10)[1]
        recall[nprobe] = np.mean([len(np.intersect1d(a, b)) for a, b in zip(found, exact, strict=True)])
    assert recall[1] < recall[8]


def test_the_shared_nprobe_is_calibrated_over_every_shard() -> None:
    """One nprobe for all shards, the fewest probes (to an eighth of the doubling from NPROBE
    that first reached it) whose merged search finds RECALL_TARGET of the sample's exact top 10
    (computed here from every row) with 95% confidence: the sample's mean recall less 1.645
    standard errors."""
    from pipeline.mining.index import NPROBE, RECALL_TARGET, calibration_rows

    vectors = unit_vectors(20_000, 32, 6)  # unclustered: IVF needs more than NPROBE of 512 cells
    shards, _ = shared_cell_shards(vectors, [5_000, 12_500], "ivf", seed=1)
    queries = vectors[calibration_rows(len(vectors), seed=1)]
    cells = ivf_cells(len(vectors))
    nprobe, recall = calibrate_nprobe(shards, queries, cells=cells)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]

    def recall_at(probes: int) -> tuple[float, float]:
        shards.set_nprobe(probes)
        found = shards.search(queries, 10)[1]
        hits = np.array([len(np.intersect1d(a, b)) for a, b in zip(found, exact, strict=True)]) / 10
        return float(hits.mean()), float(hits.mean() - 1.645 * hits.std(ddof=1) / np.sqrt(len(hits)))

    assert NPROBE < nprobe <= cells
    mean, bound = recall_at(nprobe)
    assert recall == pytest.approx(mean) and bound >= RECALL_TARGET and mean > bound
    assert recall_at(nprobe - nprobe // 8)[1] < RECALL_TARGET


def test_the_calibration_narrows_the_doubling_that_reached_the_target() -> None:
    """A search whose recall@k is nprobe / 700 (of 100 queries, those below it find all their
    exact rows, the others none). The fewest probes whose recall is 0.95 with 95% confidence
    (the mean less 1.645 standard errors of these 0/1 recalls) are found here by trying every
    nprobe. Doubling from NPROBE first reaches them at 1,024 (2x the work of 512, which falls
    short); bisecting that doubling to an eighth of its width (64) ends within 64 above."""
    from pipeline.mining.index import RECALL_TARGET, probe_until_recall

    exact = np.tile(np.arange(10), (100, 1))
    probes: list[int] = []

    def finding(nprobe: int) -> int:
        return round(100 * min(1.0, nprobe / 700))

    def search(queries: np.ndarray) -> np.ndarray:
        return np.where(np.arange(len(queries))[:, None] < finding(probes[-1]), exact, exact + 10)

    def bound(nprobe: int) -> float:
        hits = np.arange(100) < finding(nprobe)
        return hits.mean() - 1.645 * hits.std(ddof=1) / 10

    nprobe, recall = probe_until_recall(search, probes.append, np.zeros((100, 4)), exact, cells=4_096)
    fewest = next(p for p in range(1, 1_025) if bound(p) >= RECALL_TARGET)
    assert fewest > RECALL_TARGET * 700  # the margin asks for more than the mean alone would
    assert fewest <= nprobe <= fewest + 64 and nprobe != 1_024
    assert recall == pytest.approx(finding(nprobe) / 100) and bound(nprobe) >= RECALL_TARGET
    assert probes[-1] == nprobe  # the index is left at what it returns
    assert probe_until_recall(search, probes.append, np.zeros((100, 4)), exact, cells=300) == (300, 0.43)
