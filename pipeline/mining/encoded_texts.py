"""The corpus' texts under the newest weights, as a refresh reads them: the vectors of any
positions, and a search over the candidates' (a
:class:`~pipeline.mining.index.NeighbourSearch`).

The miner's shards answer (:class:`~pipeline.mining.miner_shards.MinerShards`), each holding a
range; a refresh asks for a chunk of rows' vectors at a time, however many hold them. Tests
and benches that mine precomputed vectors give every vector in one array
(``bench/embedded_texts.py``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from pipeline.mining.index import NeighbourSearch


class EncodedTexts(NeighbourSearch, Protocol):
    """Vectors of any corpus positions, and a search whose rows are candidate ordinals."""

    kind: str
    """The index kind searched (``flat``, ``ivf``, ``ivfpq``)."""
    dim: int
    """The vectors' dimension."""

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions), dim)`` float32, L2-normalised, in the order of ``positions``."""
        ...

    def search_positions(self, positions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` of the texts at ``positions`` as queries: where the texts are held,
        without their vectors coming to the caller."""
        ...

    def pair_scores(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(m,)`` float32 cosine of the texts at ``left[i]`` and ``right[i]``, computed where
        the left texts are held."""
        ...

    def nearest(self, centroids: np.ndarray) -> np.ndarray:
        """``(texts,)`` int: each text's most similar of the unit ``(cells, dim)`` ``centroids``
        (:func:`~pipeline.mining.ivf_training.nearest_cells`), found where its vector is."""
        ...
