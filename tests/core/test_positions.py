"""Positions are int32 exactly as far as int32 holds them."""

from __future__ import annotations

import numpy as np

from pipeline.core.positions import position_dtype


def test_int32_holds_every_position_up_to_its_limit_and_int64_takes_over_after() -> None:
    largest = np.iinfo(np.int32).max
    assert position_dtype(largest + 1) == np.int32  # positions 0 .. 2^31 - 1, and -1
    assert np.array([largest, -1], dtype=position_dtype(largest + 1)).tolist() == [largest, -1]
    assert position_dtype(largest + 2) == np.int64
    assert np.array([largest + 1], dtype=position_dtype(largest + 2)).tolist() == [largest + 1]
    assert position_dtype(0) == np.int32
