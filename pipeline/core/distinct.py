"""Distinct 64-bit ids by sorting, for arrays of one value a row (10M+ rows on the driver).

numpy 2's ``np.unique`` (without ``return_index``) builds a hash set, about 60 B a value on top
of its input: 250 MiB at 4M ids, more than half of the driver's budget of 100 B a row. Sorting
needs one copy of the input and a byte of mask a value.
"""

from __future__ import annotations

import numpy as np


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of ``values``, sorted (``np.unique``'s result, by sorting a copy)."""
    ranked = np.sort(values)  # equal values are equal: no need for a stable sort
    return ranked[_starts(ranked)]


def first_occurrences(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``values`` (sorted) and the index of each one's first occurrence:
    ``np.unique(values, return_index=True)`` without its flattened copy of the input."""
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    starts = _starts(ranked)
    del ranked  # before the results are allocated: the peak is the input, the order and one copy
    first = order[starts]
    del order
    return values[first], first


def _starts(ranked: np.ndarray) -> np.ndarray:
    """Where each run of equal values in the sorted ``ranked`` begins."""
    starts = np.empty(len(ranked), dtype=bool)
    starts[:1] = True
    np.not_equal(ranked[1:], ranked[:-1], out=starts[1:])
    return starts
