"""The one k-means (faiss.contrib's over a sample that assigns itself, in torch: the path of
every backend, run here on the CPU) is as good as faiss' own ``Kmeans``: the same objective,
the same centroids over parts as over one array, and an IVF index over them finds the exact
neighbours at the default nprobe."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch

from bench.embedded_texts import vector_index
from pipeline.mining.index import NPROBE, exact_top_k, ivf_cells
from pipeline.mining.ivf_training import SampleOnDevice, nearest_cells, spherical_kmeans


def clustered(n: int = 20_000, dim: int = 48, seed: int = 0) -> np.ndarray:
    """A Gaussian mixture on the unit sphere, shaped like embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n // 50, dim))
    x = centres[rng.integers(len(centres), size=n)] + 0.8 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def objective(x: np.ndarray, centroids: np.ndarray) -> float:
    """Mean cosine of each row to its nearest centroid: what spherical k-means maximises."""
    return float((x @ centroids.T).max(axis=1).mean())


def exact_neighbours(x: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return faiss.knn(queries, x, k, faiss.METRIC_INNER_PRODUCT)[1]


def test_our_kmeans_reaches_faiss_objective_with_unit_centroids():
    x = clustered()
    cells = ivf_cells(len(x))
    ours = spherical_kmeans(SampleOnDevice(x, "cpu"), cells, seed=0)
    reference = faiss.Kmeans(
        x.shape[1], cells, niter=10, seed=0, spherical=True, max_points_per_centroid=len(x)
    )
    reference.train(x)
    assert ours.shape == reference.centroids.shape == (cells, x.shape[1])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert objective(x, ours) >= objective(x, reference.centroids) - 0.01
    assert objective(x, ours) > objective(x, x[:cells]) + 0.02  # better than its starting rows
    np.testing.assert_array_equal(spherical_kmeans(SampleOnDevice(x, "cpu"), cells, seed=0), ours)  # seeded


class SplitSample:
    """A sample in parts, as a miner's shards hold it (``SampleOverShards``): each part assigns
    its own rows, the assignments are joined in order and the sums added up."""

    def __init__(self, x: np.ndarray, cuts: list[int]):
        self.parts = [SampleOnDevice(part, "cpu") for part in np.split(x, cuts)]
        self.x = x
        self.rounds = 0

    def count(self) -> int:
        return len(self.x)

    def dim(self) -> int:
        return self.x.shape[1]

    def get_subset(self, indices: np.ndarray) -> np.ndarray:
        return self.x[indices]

    def assign_to(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.rounds += 1
        answers = [part.assign_to(centroids) for part in self.parts]
        return (
            np.concatenate([a[0] for a in answers]),
            np.concatenate([a[1] for a in answers]),
            sum(
                a[2]
                for a in reversed(answers)  # added in any order
            ),
        )


def test_kmeans_over_parts_gives_the_centroids_of_kmeans_over_the_whole_sample():
    """The shards' k-means (each part assigns its own rows, sums added up in any order) is the
    one-array k-means to float32's precision, with uneven parts and one empty."""
    x = clustered(6_000, dim=32)
    cells = ivf_cells(len(x))
    whole = spherical_kmeans(SampleOnDevice(x, "cpu"), cells, seed=4)
    split = SplitSample(x, [1_000, 1_000, 4_500])
    parted = spherical_kmeans(split, cells, seed=4)
    assert split.rounds == 10
    np.testing.assert_allclose(parted, whole, atol=1e-6)
    assert not np.array_equal(
        whole, spherical_kmeans(SampleOnDevice(x, "cpu"), cells, seed=5)
    )  # the seed counts


@pytest.mark.parametrize("score_bytes", [None, 4 * 7 * 300])  # one chunk; chunks of 300 rows
def test_assignment_and_cell_sums_against_numpy(score_bytes, monkeypatch):
    if score_bytes:
        monkeypatch.setattr("pipeline.mining.ivf_training.ASSIGN_SCORES_BYTES", score_bytes)
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(5_000, 8)).astype(np.float32)
    centroids = rng.normal(size=(7, 8)).astype(np.float32)
    nearest, similarity, sums = SampleOnDevice(rows, "cpu").assign_to(centroids)
    units = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
    expected = (rows @ units.T).argmax(axis=1)
    np.testing.assert_array_equal(nearest, expected)
    np.testing.assert_allclose(similarity, (rows @ units.T).max(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(nearest_cells(torch.from_numpy(rows), centroids)[0].numpy(), expected)
    cell_sums = np.stack([rows[expected == c].astype(np.float64).sum(axis=0) for c in range(7)])
    np.testing.assert_allclose(sums, cell_sums, rtol=1e-9, atol=1e-9)
    assert sums.dtype == np.float64


def test_an_ivf_index_over_our_cells_finds_the_exact_neighbours():
    x = clustered()
    cells = ivf_cells(len(x))
    quantizer = faiss.IndexFlatIP(x.shape[1])
    quantizer.add(spherical_kmeans(SampleOnDevice(x, "cpu"), cells, seed=0))
    index = faiss.IndexIVFFlat(quantizer, x.shape[1], cells, faiss.METRIC_INNER_PRODUCT)
    assert index.is_trained  # its quantizer holds every cell
    index.nprobe = NPROBE
    index.add(x)
    _, found = index.search(x[:2000], 10)
    exact = exact_neighbours(x, x[:2000], 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])
    assert recall >= 0.95


def test_ivf_probes_more_cells_where_the_vectors_all_point_one_way():
    """A random-weights model's embeddings: every pair above 0.9. At the default nprobe IVF finds
    too few of the exact neighbours, so the build raises nprobe until a sample of its rows finds
    95% of theirs; checked here on queries the calibration never saw. Clustered vectors keep the
    default (no cost where none is needed)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20_000, 48)) * 0.15 + rng.normal(size=48)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    index = vector_index(x, kind="ivf", seed=0)
    queries = x[-500:]  # the calibration's sample is drawn with the seed, mostly elsewhere
    _, found = index.search(queries, 10)
    exact = exact_neighbours(x, queries, 10)
    assert index._index.nprobe > NPROBE
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])
    assert recall >= 0.93
    assert vector_index(clustered(), kind="ivf", seed=0)._index.nprobe == NPROBE


@pytest.mark.parametrize("block_rows", [64, 332])  # 332: the last block holds 4 rows, fewer than k
def test_exact_top_k_over_blocks_is_the_top_k_of_one_product_best_first(block_rows):
    rng = np.random.default_rng(2)
    vectors, queries = (
        rng.normal(size=(1_000, 8)).astype(np.float32),
        rng.normal(size=(7, 8)).astype(np.float32),
    )
    expected = np.argsort(-(queries @ vectors.T), axis=1)[:, :5]
    scores, rows = exact_top_k(queries, vectors.__getitem__, len(vectors), 5, block_rows=block_rows)
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_allclose(scores, np.einsum("qkd,qd->qk", vectors[rows], queries), rtol=1e-5)
