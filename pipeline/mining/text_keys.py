"""Which candidates are the same sentence as, or a known positive of, their anchor: one small
integer key per normalised text (:func:`dense_keys` of the tokenized corpus' ``text_key``,
:func:`~pipeline.data.normalize.normalized_id`), and the masks the negative filters are given,
built from those keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.distinct import sorted_distinct
from pipeline.data.normalize import normalize_text

__all__ = ["KnownPositives", "dense_keys", "duplicate_mask", "normalize_text"]


def duplicate_mask(
    candidates: np.ndarray,
    anchor_keys: np.ndarray,
    positive_keys: np.ndarray,
    candidate_keys: np.ndarray,
) -> np.ndarray:
    """True where a candidate's text key equals its anchor's or its positive's.

    Keys are non-negative integers, one per distinct text (e.g. an index of the
    :func:`normalize_text` values), in one key space for all three arrays.
    ``candidates`` index ``candidate_keys``.
    """
    valid = candidates >= 0
    keys = np.where(valid, candidate_keys[np.where(valid, candidates, 0)], -1)
    return valid & ((keys == anchor_keys[:, None]) | (keys == positive_keys[:, None]))


@dataclass(frozen=True)
class KnownPositives:
    """Every known (anchor text, positive text) pair as one sorted int64 code each: built once
    for all the rows, then looked up chunk after chunk of a mining (a chunk's own rows would
    miss the positives other rows give the same anchor text)."""

    codes: np.ndarray
    """Sorted, distinct ``anchor key x base + positive key``."""
    base: int
    """More than any key: codes never collide."""

    @classmethod
    def of(cls, anchor_keys: np.ndarray, positive_keys: np.ndarray, base: int) -> KnownPositives:
        """The pairs of ``(anchor_keys[i], positive_keys[i])``; ``base``: more than any key
        that will be looked up (the number of distinct keys, for dense ones)."""
        codes = anchor_keys.astype(np.int64) * base + positive_keys
        return cls(sorted_distinct(codes), base)

    def mask(self, candidates: np.ndarray, anchor_keys: np.ndarray, candidate_keys: np.ndarray) -> np.ndarray:
        """``(n, k)`` True where ``candidates`` (positions in ``candidate_keys``, -1: none) are a
        known positive of their row's anchor (``anchor_keys``)."""
        valid = candidates >= 0
        if not len(self.codes):
            return np.zeros(candidates.shape, dtype=bool)
        codes = (
            anchor_keys.astype(np.int64)[:, None] * self.base + candidate_keys[np.where(valid, candidates, 0)]
        )
        at = np.searchsorted(self.codes, codes).clip(max=len(self.codes) - 1)
        return valid & (self.codes[at] == codes)


def dense_keys(hashed: np.ndarray) -> np.ndarray:
    """Small integer keys (0, 1, ...) for hashed ones (the tokenized corpus' ``text_key``,
    :func:`~pipeline.data.normalize.normalized_id`): equal where the hashes are equal, and
    small enough for :class:`KnownPositives`' pair codes."""
    return np.unique(hashed, return_inverse=True)[1].astype(np.int64)
