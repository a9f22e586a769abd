"""Alignment, uniformity and BERT-whitening against direct numpy computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pipeline.evaluation.diagnostics import alignment, uniformity
from pipeline.evaluation.whitening import fit_whitening


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_alignment_is_mean_squared_distance_of_pairs():
    rng = np.random.default_rng(0)
    x, y = _unit(rng.normal(size=(20, 8))), _unit(rng.normal(size=(20, 8)))
    expected = sum(float(np.sum((a - b) ** 2)) for a, b in zip(x, y, strict=True)) / 20
    assert alignment(x, y) == pytest.approx(expected, rel=1e-12)
    assert alignment(x, x) == 0.0
    assert math.isnan(alignment(x[:0], y[:0]))


def test_uniformity_is_log_mean_gaussian_potential_over_pairs():
    rng = np.random.default_rng(1)
    x = _unit(rng.normal(size=(30, 6)))
    potentials = [
        math.exp(-2 * float(np.sum((x[i] - x[j]) ** 2))) for i, j in itertools.combinations(range(30), 2)
    ]
    assert uniformity(x) == pytest.approx(math.log(sum(potentials) / len(potentials)), rel=1e-10)
    collapsed = np.repeat(x[:1], 10, axis=0)
    assert uniformity(collapsed) == pytest.approx(0.0, abs=1e-12)  # everything in one point: worst
    assert uniformity(x) < -1.0


def test_whitening_gives_zero_mean_identity_covariance():
    rng = np.random.default_rng(2)
    mixing = rng.normal(size=(16, 16))
    x = rng.normal(size=(2000, 16)) @ mixing + 3.0  # correlated, off-centre, anisotropic
    w = fit_whitening(x)
    z = w.apply(x).astype(np.float64)
    assert np.abs(z.mean(0)).max() < 1e-4
    assert np.abs(np.cov(z, rowvar=False) - np.eye(16)).max() < 1e-4

    k = 5
    wk = fit_whitening(x, dim=k)
    zk = wk.apply(x).astype(np.float64)
    assert zk.shape == (2000, k) and np.abs(np.cov(zk, rowvar=False) - np.eye(k)).max() < 1e-4
    # the kept directions are the k of largest variance: numpy's own eigendecomposition
    values, vectors = np.linalg.eigh(np.cov(x, rowvar=False))
    top = vectors[:, np.argsort(values)[::-1][:k]]
    projected = (x - x.mean(0)) @ top / np.sqrt(np.sort(values)[::-1][:k])
    assert np.abs(np.abs(zk) - np.abs(projected)).max() < 1e-3  # equal up to each axis's sign
    # Mean-pooled LayerNorm outputs satisfy a linear constraint: that direction has no variance
    # and is dropped instead of being blown up to unit variance.
    centred = x - x.mean(1, keepdims=True)
    flat = fit_whitening(centred)
    assert flat.out_dim == 15
    assert np.abs(np.cov(flat.apply(centred).astype(np.float64), rowvar=False) - np.eye(15)).max() < 1e-4
    with pytest.raises(ValueError, match="whitening-dim"):
        fit_whitening(x, dim=17)
