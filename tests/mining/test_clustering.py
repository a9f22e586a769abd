"""Spherical k-means with real FAISS: well-separated blobs come back as the clusters."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mining.clustering import kmeans_clusters


def _blobs(num_blobs: int, per_blob: int = 100, dim: int = 16, seed: int = 0):
    """Tight unit-vector blobs around orthogonal directions: ``(x, blob of each row)``."""
    rng = np.random.default_rng(seed)
    blob = rng.permutation(np.arange(num_blobs * per_blob) % num_blobs)
    x = 3 * np.eye(dim)[blob] + 0.05 * rng.normal(size=(len(blob), dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), blob


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two labellings group the rows alike (up to relabelling)."""
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blobs_come_back_as_clusters(seed):
    x, blob = _blobs(8, seed=seed)
    clusters = kmeans_clusters(x, 8, seed=seed)
    assert clusters.shape == (len(x),) and clusters.dtype == np.int64
    assert clusters.min() >= 0 and clusters.max() < 8
    assert _same_partition(clusters, blob)


def test_seeded_and_float64_input_accepted():
    x, _ = _blobs(5, seed=4)
    first = kmeans_clusters(x.astype(np.float64), 5, seed=3)
    assert np.array_equal(first, kmeans_clusters(x.astype(np.float32), 5, seed=3))


def test_as_many_clusters_as_rows_and_one_cluster():
    x, _ = _blobs(3, per_blob=4, seed=5)
    assert sorted(kmeans_clusters(x, len(x), seed=0).tolist()) == list(range(len(x)))
    assert kmeans_clusters(x, 1, seed=0).tolist() == [0] * len(x)


def test_gpu_request_without_a_faiss_gpu_runs_on_cpu():
    import faiss

    if faiss.get_num_gpus() > 0:
        pytest.skip("this FAISS build has GPUs: the request is honoured")
    x, blob = _blobs(4, seed=6)
    assert np.array_equal(kmeans_clusters(x, 4, seed=0, use_gpu=True), kmeans_clusters(x, 4, seed=0))


@pytest.mark.parametrize(
    ("shape", "num_clusters", "message"),
    [
        ((10, 4), 0, "num_clusters must be in"),
        ((10, 4), 11, r"num_clusters must be in \[1, 10\]"),
        ((0, 4), 1, "non-empty"),
        ((10,), 2, "non-empty"),
    ],
)
def test_impossible_requests_are_refused(shape, num_clusters, message):
    with pytest.raises(ValueError, match=message):
        kmeans_clusters(np.ones(shape, dtype=np.float32), num_clusters, seed=0)
