"""The integer type of row and text positions that travel as columns.

A mined negatives column is ``(rows, k)`` positions (-1 where none). At 100M rows and k = 7,
int64 is 5.6 GB where int32 is 2.8 GB: in the miner's chunks, in the column each refresh writes
to run storage, and in every rank's share of it. int32 holds any position below 2^31; a larger
table keeps int64.
"""

from __future__ import annotations

import numpy as np

INT32_POSITIONS = int(np.iinfo(np.int32).max) + 1
"""Rows or texts up to which positions (and -1) are int32."""


def position_dtype(count: int) -> np.dtype:
    """The dtype of positions among ``count`` rows or texts: int32 up to :data:`INT32_POSITIONS`
    of them (positions 0 to 2^31 - 1), int64 above."""
    return np.dtype(np.int32) if count <= INT32_POSITIONS else np.dtype(np.int64)
