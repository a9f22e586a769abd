"""Which rows must not share a batch: a row and a row it flags, or a row that flags it (pairs
are checked both ways). One graph serves every sampler: while batches are built
(:class:`~pipeline.batching.batch_builder.BatchBuilder`) and after
(:func:`~pipeline.batching.separation.separate_false_negatives`).
"""

from __future__ import annotations

import numpy as np


class FalseNegativeGraph:
    """Which rows must not share a batch: each row and every row it flags, or that flags
    it, as one sorted array of partners per row (CSR), so a row's partners are one slice away.

    Args:
        false_negatives: ``(n, m)`` rows that must not share a batch with the row, -1
            elsewhere (a row flagging itself is ignored). :meth:`from_pairs` builds one from
            a list of flagged pairs instead.
    """

    def __init__(self, false_negatives: np.ndarray):
        false_negatives = np.asarray(false_negatives)
        valid = false_negatives >= 0
        src = np.broadcast_to(np.arange(len(false_negatives))[:, None], false_negatives.shape)[valid]
        self._link(len(false_negatives), src, false_negatives[valid])

    @classmethod
    def from_pairs(cls, num_rows: int, src: np.ndarray, dst: np.ndarray) -> FalseNegativeGraph:
        """The graph of the flagged ``(src[i], dst[i])`` pairs of ``num_rows`` rows, without a
        dense ``(n, m)`` matrix: for flags that come as a list of edges (rows sharing a text)."""
        graph = cls.__new__(cls)
        graph._link(num_rows, np.asarray(src), np.asarray(dst))
        return graph

    def _link(self, num_rows: int, src: np.ndarray, dst: np.ndarray) -> None:
        src, dst = src.astype(np.int64), dst.astype(np.int64)
        keep = src != dst
        self.src, self.dst = src[keep], dst[keep]
        """The flagged ``(row, flagged row)`` pairs."""
        both_src = np.concatenate([self.src, self.dst])
        order = np.argsort(both_src, kind="stable")
        self._partners = np.concatenate([self.dst, self.src])[order]
        self._bounds = np.concatenate([[0], np.cumsum(np.bincount(both_src, minlength=num_rows))])

    def partners(self, row: int) -> np.ndarray:
        """The rows that must not share a batch with ``row`` (a mutual flag appears twice)."""
        return self._partners[self._bounds[row] : self._bounds[row + 1]]

    def together(self, batch_of: np.ndarray) -> int:
        """How many flagged pairs share a batch, given each row's batch (as
        :func:`~pipeline.mining.plan_quality.false_negative_pairs` counts them)."""
        return int((batch_of[self.src] == batch_of[self.dst]).sum())
