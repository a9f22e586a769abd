"""Sort-based distinct ids (pipeline/core/distinct.py) against numpy's own np.unique."""

import numpy as np
import pytest

from pipeline.core.distinct import first_occurrences, sorted_distinct


@pytest.mark.parametrize("size", [0, 1, 2, 1000])
def test_sorted_distinct_is_np_unique(size: int) -> None:
    rng = np.random.default_rng(size)
    values = rng.integers(-3, size // 3 + 2, size=size).astype(np.int64)
    np.testing.assert_array_equal(sorted_distinct(values), np.unique(values))


@pytest.mark.parametrize("size", [0, 1, 2, 1000])
def test_first_occurrences_are_np_uniques_first_indexes(size: int) -> None:
    rng = np.random.default_rng(size)
    values = rng.integers(0, size // 4 + 2, size=size).astype(np.int64)
    before = values.copy()
    found, first = first_occurrences(values)
    expected_found, expected_first = np.unique(values, return_index=True)
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(first, expected_first)
    np.testing.assert_array_equal(values, before)  # the input is left as it was
    for value, at in zip(found.tolist(), first.tolist(), strict=True):  # the first, not any
        assert values[at] == value and value not in values[:at]
