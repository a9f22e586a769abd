"""An index built from a :class:`~pipeline.mining.index.VectorSource` (a miner shard's encoder):
the vectors are fetched a chunk at a time, none twice, and the ``faiss-cpu`` flat or IVF index
holds the only copy; it searches exactly as the index over the same vectors as one array, and
gives the vectors back as they were."""

from __future__ import annotations

import numpy as np
import pytest

from bench.embedded_texts import vector_index
from pipeline.mining import index as index_module
from pipeline.mining.index import VectorSource, training_rows


def unit_rows(n: int = 6_000, dim: int = 24, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(60, dim))
    x = centres[rng.integers(len(centres), size=n)] + 0.7 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class CountingEncoder:
    """Stands in for a shard's encoder: the rows of ``x``, counting how often each is asked."""

    def __init__(self, x: np.ndarray):
        self.x, self.asked = x, np.zeros(len(x), dtype=np.int64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        np.add.at(self.asked, positions, 1)
        return self.x[positions].copy()


@pytest.mark.parametrize("kind", ["flat", "ivf", "ivfpq"])
def test_an_index_from_a_source_searches_as_one_from_the_array_and_encodes_each_row_once(monkeypatch, kind):
    monkeypatch.setattr(index_module, "ADD_CHUNK_ROWS", 1_000)  # several chunks, the sample among them
    x = unit_rows()
    encoder = CountingEncoder(x)
    streamed = vector_index(VectorSource(len(x), x.shape[1], encoder), kind=kind, seed=3)
    whole = vector_index(x, kind=kind, seed=3)
    assert encoder.asked.min() == encoder.asked.max() == 1
    # The same sample, cells, additions and calibrated nprobe: the same answers.
    queries = x[::7]
    np.testing.assert_array_equal(streamed.search(queries, 10)[1], whole.search(queries, 10)[1])
    np.testing.assert_array_equal(streamed.search(queries, 10)[0], whole.search(queries, 10)[0])
    positions = np.array([5, 0, 5_999, 1_234, 1_000])
    np.testing.assert_array_equal(streamed.vectors_of(positions), x[positions])
    # flat and IVF hold the vectors only in faiss; IVF-PQ's codes are not the vectors, so it
    # keeps the array.
    assert (streamed.vectors is None) == (kind != "ivfpq")


def test_the_training_sample_is_seeded_and_sized_by_the_cells():
    assert len(training_rows(6_000, "flat", seed=0)) == 0
    sample = training_rows(100_000, "ivf", seed=1)
    assert len(sample) == index_module.ivf_cells(100_000) * index_module.TRAIN_POINTS_PER_CELL
    assert np.all(np.diff(sample) > 0)
    np.testing.assert_array_equal(sample, training_rows(100_000, "ivf", seed=1))


def test_ivf_searched_in_blocks_of_queries_answers_as_in_one(monkeypatch):
    """A search holds each query's probed cells (nprobe x 12 B): queries go in blocks of
    IVF_PROBE_BYTES, and the answers do not depend on the blocks."""
    x = unit_rows()
    index = vector_index(x, kind="ivf", seed=0)
    whole = index.search(x[:500], 10)
    monkeypatch.setattr(index_module, "IVF_PROBE_BYTES", 12 * index._index.nprobe * 7)  # 7 queries a block
    blocked = index.search(x[:500], 10)
    np.testing.assert_array_equal(blocked[1], whole[1])
    np.testing.assert_array_equal(blocked[0], whole[0])
