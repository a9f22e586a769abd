"""Rows scaled to unit length, so that inner products are cosines: what every evaluator scores."""

from __future__ import annotations

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """``x`` (``(n, d)``) as float64 rows of unit L2 norm; an all-zero row stays zero rather than
    becoming NaN."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
