"""BERT-whitening (Su et al., 2021): an affine map that gives embeddings zero mean and
identity covariance, optionally keeping only the first k directions.

Fitted on corpus embeddings ``x`` (rows are sentences): ``mu = mean(x)``, ``cov = U Lambda U^T``,
``W = U Lambda^(-1/2)``, and ``whiten(x) = (x - mu) W[:, :k]``.

A post-hoc evaluation of ``jobs/evaluate.py`` (``--whiten-on``) only: training neither fits nor
exports it, since it costs a contrastively trained model 1-2 STS points (docs/results.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Whitening:
    """``whiten(x) = x @ weight.T + bias``; ``weight`` is ``(k, dim)``, ``bias`` is ``(k,)``."""

    weight: np.ndarray
    bias: np.ndarray

    @property
    def out_dim(self) -> int:
        return int(self.weight.shape[0])

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Whitened rows of ``x`` (``(n, dim)`` -> ``(n, k)``), float32."""
        return (np.asarray(x, dtype=np.float64) @ self.weight.T.astype(np.float64) + self.bias).astype(
            np.float32
        )


def fit_whitening(x: np.ndarray, dim: int | None = None, rcond: float = 1e-5) -> Whitening:
    """Fit whitening on ``x`` (``(n, d)`` raw, un-normalised embeddings).

    Args:
        dim: keep the first ``dim`` whitened directions (largest variance first); ``None``: all
            that carry variance.
        rcond: directions whose variance is below ``rcond`` x the largest are dropped, as a
            pseudo-inverse does. Mean-pooled outputs of a LayerNorm-ed encoder lie in a
            hyperplane, so one direction has no variance at all; scaled up to unit variance it
            would hold nothing but float rounding, amplified thousands of times.

    Raises:
        ValueError: fewer than two rows, or ``dim`` larger than the embedding size.
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    k = d if dim is None else dim
    if n < 2:
        raise ValueError(f"whitening needs at least 2 embeddings (got {n})")
    if not 1 <= k <= d:
        raise ValueError(f"--whitening-dim must be in [1, {d}] for {d}-dimensional embeddings (got {k})")
    mu = x.mean(axis=0)
    cov = np.cov(x - mu, rowvar=False)
    u, s, _ = np.linalg.svd(cov)
    k = min(k, int(np.sum(s > rcond * s[0])))
    w = u[:, :k] / np.sqrt(s[:k])  # (d, k)
    return Whitening(weight=w.T.astype(np.float32), bias=(-mu @ w).astype(np.float32))
