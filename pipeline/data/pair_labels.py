"""Labelled pair rows: which rows are pairs to train on (label 1) and which give their anchor
a negative (label 0), and how those given negatives are dealt out to the anchor's rows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.errors import DataError
from pipeline.data.utf8 import _as_text


def label_codes(labels: Any) -> tuple[np.ndarray, pa.Array]:
    """Per row: 1 (label 1), 0 (label 0) or -1 (any other value), and the other values as
    ``repr`` strings (null elsewhere), for the error that names the first. Integers, floats and
    booleans compare as numbers, strings after stripping (``"1"``, ``"0"``). Runs in the
    reading stage, a block at a time."""
    dtype = labels.type
    if pa.types.is_dictionary(dtype):
        labels, dtype = labels.cast(dtype.value_type), dtype.value_type
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype):
        numbers = labels.cast(pa.float64())
        is_one, is_zero = pc.equal(numbers, 1.0), pc.equal(numbers, 0.0)
    elif pa.types.is_null(dtype):
        is_one = is_zero = pa.array(np.zeros(len(labels), dtype=bool))
    else:
        text, _ = _as_text(labels)
        text = pc.utf8_trim_whitespace(text)
        is_one, is_zero = pc.equal(text, "1"), pc.equal(text, "0")
    one = pc.fill_null(is_one, False).to_numpy(zero_copy_only=False)
    zero = pc.fill_null(is_zero, False).to_numpy(zero_copy_only=False)
    codes = np.where(one, 1, np.where(zero, 0, -1)).astype(np.int8)
    other: list[str | None] = [None] * len(codes)
    for row in np.flatnonzero(codes < 0):
        value = labels[int(row)].as_py()
        other[row] = repr(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return codes, pa.array(other, pa.string())


def require_labels(codes: np.ndarray, other: pa.Array, path: str, key: str) -> np.ndarray:
    """Per row: label 1 (True) or 0 (False), from :func:`label_codes` of the whole file.

    Raises:
        DataError: naming ``key``, the file, the first row with another value, and the value.
    """
    bad = codes < 0
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(
            f"{key}: {path}, row {row + 1}: label {other[row].as_py()} is neither 1 (a pair to "
            "train on) nor 0 (a given negative of its anchor)"
        )
    return codes == 1


def round_robin_negatives(
    anchors: np.ndarray, positives: np.ndarray, negative_anchors: np.ndarray, negative_texts: np.ndarray
) -> np.ndarray:
    """A given negative per (anchor, positive) row from the label-0 rows
    ``(negative_anchors[i], negative_texts[i])``: the j-th row of anchor ``a`` gets the
    (j mod n)-th of a's n distinct label-0 texts, in file order; -1 where ``a`` has none.
    A label-0 text that is also a positive of the same anchor is not its negative.

    All four are text ids (:func:`~pipeline.data.utf8.stable_row_id`), so the bookkeeping is
    over integers; it is per anchor in Python, which labelled files (annotated corpora of
    tens of thousands of rows, not web-scale pair files) afford.
    """
    positives_of: dict[int, set[int]] = defaultdict(set)
    for anchor, text in zip(anchors.tolist(), positives.tolist(), strict=True):
        positives_of[anchor].add(text)
    candidates: dict[int, dict[int, None]] = defaultdict(dict)  # ordered, distinct
    for anchor, text in zip(negative_anchors.tolist(), negative_texts.tolist(), strict=True):
        if text not in positives_of[anchor]:
            candidates[anchor][text] = None
    ordered = {anchor: list(texts) for anchor, texts in candidates.items()}
    seen: dict[int, int] = defaultdict(int)
    negatives = np.full(len(anchors), -1, dtype=np.int64)
    for row, anchor in enumerate(anchors.tolist()):
        texts = ordered.get(anchor)
        if texts:
            negatives[row] = texts[seen[anchor] % len(texts)]
            seen[anchor] += 1
    return negatives
