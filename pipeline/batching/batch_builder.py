"""Batches built row by row over the rows no batch holds yet, each candidate checked against
the batch's flagged false negatives: how the ``knn`` sampler grows its batches.
"""

from __future__ import annotations

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph


class BatchBuilder:
    """Batches built one at a time over the rows not yet assigned to any batch.

    A candidate is checked against the batch in O(its partners), not O(batch), through
    :class:`FalseNegativeGraph`. Rows are converted to Python lists on demand, not all at
    once: every row joins exactly one batch, so the work is the same, and memory stays
    O(batch x k) instead of holding n x k Python objects (about 4.5 GB at a million rows
    with k = 65).

    Args:
        num_rows: rows to cover.
        false_negatives: optional ``(n, m)`` rows that must not share a batch with the row,
            -1 elsewhere.
        visit_order: ``(n,)`` a random permutation of the rows: where batches start and what
            tops them up.
    """

    def __init__(self, num_rows: int, false_negatives: np.ndarray | None, visit_order: np.ndarray):
        self.graph = FalseNegativeGraph(false_negatives) if false_negatives is not None else None
        self.visit_order = visit_order
        # A bytearray, not a numpy array: batch growth reads it once per candidate, and a
        # bytearray item is several times cheaper to read than a numpy scalar.
        self.assigned = bytearray(num_rows)
        self.cursor = 0
        """Every row of ``visit_order`` before it is assigned."""
        self.members: list[int] = []
        self.member_set: set[int] = set()

    def begin(self) -> None:
        """Start a new, empty batch."""
        self.members, self.member_set = [], set()

    def next_unassigned(self) -> int | None:
        """The first unassigned row of the random order (not yet added), None when all are assigned."""
        order, assigned = self.visit_order, self.assigned
        while self.cursor < len(order) and assigned[order[self.cursor]]:
            self.cursor += 1
        return int(order[self.cursor]) if self.cursor < len(order) else None

    def can_join(self, row: int) -> bool:
        """Whether ``row`` is no member's false negative and no member is its false negative."""
        return self.graph is None or self.member_set.isdisjoint(self.graph.partners(row).tolist())

    def add(self, row: int) -> None:
        """Put ``row`` in the batch."""
        self.assigned[row] = True
        self.members.append(row)
        self.member_set.add(row)

    def top_up(self, size: int) -> None:
        """Fill the batch to ``size`` from the random order, preferring rows that are nobody's
        false negative here; when none is left (tiny corpora), any unassigned row, which may
        leave a flagged pair together for
        :func:`~pipeline.batching.separation.separate_false_negatives` to repair."""
        if len(self.members) >= size or self.next_unassigned() is None:
            return
        order, assigned = self.visit_order, self.assigned
        fallback: list[int] = []
        for scan in range(self.cursor, len(order)):
            if len(self.members) == size:
                break
            row = int(order[scan])
            if assigned[row]:
                continue
            if self.can_join(row):
                self.add(row)
            else:
                fallback.append(row)
        for row in fallback:
            if len(self.members) == size:
                break
            self.add(row)
