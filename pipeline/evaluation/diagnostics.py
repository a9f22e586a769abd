"""Alignment and uniformity (Wang & Isola, 2020), the diagnostics of the SimCSE analysis.

Both take L2-normalised embeddings; lower is better for both. Alignment measures how close
positive pairs sit; uniformity how evenly all embeddings spread over the sphere. SimCSE
computes alignment on STS pairs with gold score >= 4 and uniformity on all STS sentences.
"""

from __future__ import annotations

import numpy as np


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Mean ``||x_i - y_i||^alpha`` over positive pairs.

    Args:
        x, y: ``(pairs, dim)`` L2-normalised embeddings; row i of ``x`` pairs with row i of ``y``.

    Returns: a float in [0, 2^alpha]; NaN for no pairs.
    """
    if len(x) == 0:
        return float("nan")
    diff = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    return float(np.mean(np.linalg.norm(diff, axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0, max_rows: int = 5000, seed: int = 0) -> float:
    """``log mean_{i<j} exp(-t ||x_i - x_j||^2)`` over all pairs of rows.

    Args:
        x: ``(n, dim)`` L2-normalised embeddings, n >= 2.
        max_rows: above this many rows a fixed random sample of them is used (pairs grow as n^2).

    Returns: a float <= 0 (about -4 for well-spread 768-d embeddings, 0 for a collapsed model).
    """
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    if len(x) > max_rows:
        x = x[np.random.default_rng(seed).choice(len(x), max_rows, replace=False)]
    squared_norms = (x * x).sum(1)
    distances = np.maximum(squared_norms[:, None] + squared_norms[None, :] - 2.0 * (x @ x.T), 0.0)
    upper = distances[np.triu_indices(len(x), k=1)]
    # log-mean-exp, shifted by the max exponent for stability
    exponents = -t * upper
    top = exponents.max()
    return float(top + np.log(np.mean(np.exp(exponents - top))))
