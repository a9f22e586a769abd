"""Word repetition, the augmentation of ESimCSE, on token ids.

Dropout alone gives SimCSE's two views the same length, and the model learns that
same-length sentences are similar. ESimCSE repeats a few random tokens in one view so that
positives differ in length: for a sentence of L tokens (special tokens excluded) it draws
``dup_len`` uniformly from ``[0, max(2, int(dup_rate * L))]`` and duplicates that many
distinct positions in place. ESimCSE's setting is ``dup_rate = 0.32``.
"""

from __future__ import annotations

import numpy as np


def repeat_words(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    dup_rate: float,
    rng: np.random.Generator,
    pad_token_id: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Duplicate random tokens of each row, keeping the first and last token ([CLS]/[SEP]).

    Args:
        input_ids: ``(n, width)`` right-padded token ids, each row starting and ending with a
            special token.
        attention_mask: ``(n, width)`` 1 for real tokens.
        dup_rate: share of a row's tokens that may be repeated (see module docstring).
        rng: random source (seed it for reproducible batches).
        pad_token_id: fills the new padding.

    Returns:
        ``(input_ids, attention_mask)`` of shape ``(n, new_width)``, right-padded.
    """
    rows = []
    for ids, mask in zip(input_ids, attention_mask, strict=True):
        length = int(mask.sum())
        inner = length - 2  # tokens between the two special tokens
        if inner <= 0:
            rows.append(ids[:length])
            continue
        dup_len = int(rng.integers(0, max(2, int(dup_rate * inner)) + 1))
        dup_len = min(dup_len, inner)
        chosen = rng.choice(np.arange(1, length - 1), size=dup_len, replace=False)
        repeats = np.ones(length, dtype=np.int64)
        repeats[chosen] = 2
        rows.append(np.repeat(ids[:length], repeats))
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad_token_id, dtype=input_ids.dtype)
    out_mask = np.zeros((len(rows), width), dtype=attention_mask.dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
        out_mask[i, : len(row)] = 1
    return out, out_mask
