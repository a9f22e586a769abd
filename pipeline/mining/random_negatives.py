"""Random pool negatives to mix with the mined ones (``mining.random_negatives``)."""

from __future__ import annotations

import numpy as np

from pipeline.mining.text_keys import KnownPositives, duplicate_mask


def random_pool_negatives(
    keys: np.ndarray, anchor: np.ndarray, positive: np.ndarray, *, pool: np.ndarray, count: int, seed: int
) -> np.ndarray:
    """``count`` random pool texts per anchor, to mix with its mined negatives.

    Mined negatives alone can be too hard, or false negatives the filters missed; mixing in
    random ones is what made self-mined negatives pay off in tevatron #43. A draw that is the
    same text as the anchor or its positive is redrawn (a few rounds), and left out (-1) if
    it still is: a tiny pool of near-identical texts. A known positive of the anchor (another
    row's positive for the same anchor text) is redrawn the same way.

    Args:
        keys: ``(texts,)`` :func:`~pipeline.mining.text_keys.dense_keys` of the texts' ``text_key``.
        anchor, positive: ``(n,)`` each row's anchor and positive text positions.
        pool: positions of the candidate texts (``data.pool``, else the distinct positives:
            :meth:`~pipeline.data.triplets.Triplets.candidate_pool`).
        count: random negatives per anchor.
        seed: makes the draw deterministic.

    Returns:
        ``(n, count)`` text positions in ``pool``'s dtype, -1 where no acceptable draw was found.
    """
    rng = np.random.default_rng(seed)
    n = len(anchor)
    drawn = pool[rng.integers(0, len(pool), size=(n, count))]

    known = KnownPositives.of(
        keys[anchor], keys[positive], int(keys.max(initial=0)) + 1
    )  # once, not per round

    def clashes() -> np.ndarray:
        same = duplicate_mask(drawn, keys[anchor], keys[positive], keys)
        return same | known.mask(drawn, keys[anchor], keys)

    for _ in range(8):
        clash = clashes()
        if not clash.any():
            break
        drawn[clash] = pool[rng.integers(0, len(pool), size=int(clash.sum()))]
    return np.where(clashes(), -1, drawn)
