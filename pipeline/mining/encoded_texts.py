"""The corpus' texts under the newest weights, as a refresh reads them: the vectors of any
positions, and a search over the candidates'.

The miner's shards answer (:class:`~pipeline.mining.miner_shards.MinerShards`), each holding a
range; a refresh asks for a chunk of rows' vectors at a time, however many hold them. Tests
and benches that mine precomputed vectors give every vector in one array
(``bench/embedded_texts.py``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class EncodedTexts(Protocol):
    """Vectors of any corpus positions, and a search whose rows are candidate ordinals."""

    rows: int
    """Candidates searched."""
    backend: str
    """Where the search runs and its index: ``<backend>/<kind>``, e.g. ``faiss-cpu/flat``."""
    build_seconds: float
    """What building the index took."""

    kind: str
    """The index kind searched (``flat``, ``ivf``, ``ivfpq``)."""
    dim: int
    """The vectors' dimension."""

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(m, min(k, rows))`` scores, best first, and candidate ordinals (-1: none)."""
        ...

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

    def keys_of(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions),)`` int64 text keys (:func:`~pipeline.data.normalize.normalized_id`)
        of the texts at any ``positions``, from their holders: equal keys, the same sentence."""
        ...

    def cell_counts(self, centroids: np.ndarray) -> np.ndarray:
        """``(holders, cells)`` int64: every holder assigns its texts to their most similar of
        the unit ``(cells, dim)`` ``centroids`` where their vectors are
        (:func:`~pipeline.mining.ivf_training.nearest_cells`), keeps the assignment, and counts
        each cell's texts; holders in position order."""
        ...

    def order_by_cell(self, offsets: np.ndarray) -> None:
        """Every holder ranks its texts in the partition order from its row of ``offsets``
        (``(holders, cells)``, :func:`~pipeline.mining.corpus_partitions.rank_offsets`), as a
        :class:`~pipeline.mining.corpus_partitions.RankedRows`, after :meth:`cell_counts`."""
        ...

    def rows_ranked(self, lo: int, hi: int) -> np.ndarray:
        """The sorted positions of the texts ranked ``lo`` to ``hi - 1`` in the partition order
        (after :meth:`order_by_cell`), gathered from every holder."""
        ...

    def record_batches(
        self, positions: np.ndarray, batches: np.ndarray, *, version: int, previous: int | None
    ) -> np.ndarray:
        """Every holder keeps the batch (``batches[i]``, int32) of its text at ``positions[i]``
        in refresh ``version``'s plan, and the refreshes' before ``previous`` are dropped.

        Returns:
            ``(len(positions),)`` int32: each text's batch in refresh ``previous``'s plan; -1
            where its holder does not know it (``previous`` None, or a holder started since).
        """
        ...
