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


def label_is_positive(labels: Any, path: str, key: str) -> np.ndarray:
    """Per row: label 1 (True) or 0 (False). Integers, floats and booleans compare as numbers,
    strings after stripping (``"1"``, ``"0"``).

    Raises:
        DataError: naming ``key``, the file, the first row with another value, and the value.
    """
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
    bad = ~(one | zero)
    if bad.any():
        row = int(np.argmax(bad))
        value = labels[row].as_py()
        value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        raise DataError(
            f"{key}: {path}, row {row + 1}: label {value!r} is neither 1 (a pair to "
            "train on) nor 0 (a given negative of its anchor)"
        )
    return one


def round_robin_negatives(
    anchors: list[str], positives: list[str], negative_anchors: list[str], negative_texts: list[str]
) -> list[str]:
    """A given negative per (anchor, positive) row from the label-0 rows
    ``(negative_anchors[i], negative_texts[i])``: the j-th row of anchor ``a`` gets the
    (j mod n)-th of a's n distinct label-0 texts, in file order; ``""`` where ``a`` has none.
    A label-0 text that is also a positive of the same anchor is not its negative."""
    positives_of: dict[str, set[str]] = defaultdict(set)
    for anchor, text in zip(anchors, positives, strict=True):
        positives_of[anchor].add(text)
    candidates: dict[str, dict[str, None]] = defaultdict(dict)  # ordered, distinct
    for anchor, text in zip(negative_anchors, negative_texts, strict=True):
        if text not in positives_of[anchor]:
            candidates[anchor][text] = None
    ordered = {anchor: list(texts) for anchor, texts in candidates.items()}
    seen: dict[str, int] = defaultdict(int)
    negatives = []
    for anchor in anchors:
        texts = ordered.get(anchor)
        if texts:
            negatives.append(texts[seen[anchor] % len(texts)])
            seen[anchor] += 1
        else:
            negatives.append("")
    return negatives
