"""Keeping flagged false negatives out of each other's batches after the batches are cut:
:func:`separate_false_negatives` swaps rows between batches, which repairs batches cut all at
once (random ones) and is every sampler's safety net for the pairs a tiny or densely flagged
corpus left together.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph


def separate_false_negatives(
    batches: list[np.ndarray],
    false_negatives: np.ndarray | FalseNegativeGraph | None,
    rng: np.random.Generator,
    *,
    like: np.ndarray | None = None,
    attempts: int = 48,
    passes: int = 3,
) -> tuple[list[np.ndarray], int]:
    """Swap rows between batches until no batch holds a row and a row it flags (or that flags it).

    For each row r that shares its batch A with a flagged partner, random rows s of other
    batches B are tried; the first for which the swap creates no new conflict (r has no
    partner in B without s, s none in A without r) is swapped with r. Batch sizes never
    change. With ``like`` (labels such as row lengths), the tries go in three rounds of
    ``attempts``, so that each batch keeps its make-up where it can:

    1. s of r's own label: every batch keeps its labels exactly;
    2. s of a batch holding r's label, s's label one A holds: no batch gains a label (a
       batch keeps its widest row);
    3. any s.

    Work is bounded: at most ``passes x conflicting rows x 3 attempts`` tries, each
    O(partners). Conflicts that remain (a corpus too small or too densely flagged to place
    every pair apart) are left in the plan and counted in the return value.

    Args:
        batches: the batches, covering rows ``0..n-1`` once each (not modified).
        false_negatives: ``(n, m)`` rows that must not share a batch with the row, -1
            elsewhere, or their :class:`FalseNegativeGraph`; None: nothing to separate.
        rng: the sampler's generator; not drawn from when there is no conflict, so a plan
            without conflicts is the same with and without this step.
        like: optional ``(n,)`` labels swaps should keep (see above).
        attempts: tries per conflicting row, pass and round.
        passes: rounds over the rows still in conflict.

    Returns:
        The batches after the swaps (new arrays), and how many (row, flagged row) pairs still
        share a batch (as :func:`~pipeline.mining.plan_quality.false_negative_pairs` counts them).
    """
    placement = Placement.of(batches)
    if false_negatives is None:
        return placement.batches, 0
    graph = (
        false_negatives
        if isinstance(false_negatives, FalseNegativeGraph)
        else FalseNegativeGraph(false_negatives)
    )
    if len(batches) < 2 or not placement.conflicts(graph).any():
        return placement.batches, graph.together(placement.batch_of)
    labels = _Labels(like, placement.batches) if like is not None else None
    tries = 3 * attempts if labels is not None else attempts
    for _ in range(passes):
        together = placement.conflicts(graph)
        if not together.any():
            break
        conflicted = np.unique(np.concatenate([graph.src[together], graph.dst[together]]))
        for row in rng.permutation(conflicted).tolist():
            if not (placement.batch_of[graph.partners(row)] == placement.batch_of[row]).any():
                continue  # an earlier swap already moved its partner away
            for attempt in range(tries):
                other = draw_swap_partner(row, attempt // attempts, placement, labels, rng)
                if other >= 0 and swap_keeps_apart(placement, graph, row, other):
                    if labels is not None:
                        labels.swapped(
                            row, int(placement.batch_of[row]), other, int(placement.batch_of[other])
                        )
                    placement.swap(row, other)
                    break
    return placement.batches, graph.together(placement.batch_of)


@dataclass
class Placement:
    """Which batch each row is in, and where in it: the state the swaps of
    :func:`separate_false_negatives` change, kept consistent by :meth:`swap`."""

    batches: list[np.ndarray]
    batch_of: np.ndarray
    """``(n,)`` the batch index of each row."""
    position: np.ndarray
    """``(n,)`` each row's index inside its batch."""

    @classmethod
    def of(cls, batches: list[np.ndarray]) -> Placement:
        """A placement over copies of ``batches`` (which cover rows ``0..n-1`` once each)."""
        copies = [np.asarray(b, dtype=np.int64).copy() for b in batches]
        n = sum(len(b) for b in copies)
        batch_of, position = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for index, rows in enumerate(copies):
            batch_of[rows] = index
            position[rows] = np.arange(len(rows))
        return cls(copies, batch_of, position)

    def conflicts(self, graph: FalseNegativeGraph) -> np.ndarray:
        """``(edges,)`` True where an edge's two rows share a batch."""
        return self.batch_of[graph.src] == self.batch_of[graph.dst]

    def swap(self, row: int, other: int) -> None:
        """Exchange two rows of different batches, each taking the other's place."""
        home, away = int(self.batch_of[row]), int(self.batch_of[other])
        self.batches[home][self.position[row]], self.batches[away][self.position[other]] = other, row
        self.batch_of[row], self.batch_of[other] = away, home
        self.position[row], self.position[other] = self.position[other], self.position[row]


def swap_keeps_apart(placement: Placement, graph: FalseNegativeGraph, row: int, other: int) -> bool:
    """Whether swapping ``row`` and ``other`` creates no new conflict: they are in different
    batches, ``row`` has no partner in ``other``'s batch (``other`` aside) and ``other`` none
    in ``row``'s (``row`` aside)."""
    home, away = int(placement.batch_of[row]), int(placement.batch_of[other])
    if home == away:
        return False
    mine, theirs = graph.partners(row), graph.partners(other)
    if ((placement.batch_of[mine] == away) & (mine != other)).any():
        return False
    return not ((placement.batch_of[theirs] == home) & (theirs != row)).any()


def draw_swap_partner(
    row: int, round_index: int, placement: Placement, labels: _Labels | None, rng: np.random.Generator
) -> int:
    """A row to try swapping ``row`` with, by round (see :func:`separate_false_negatives`):
    0 one of ``row``'s own label, 1 one of a batch holding its label whose label ``row``'s
    batch holds (-1 when the one drawn has not), 2 (or without labels) any row."""
    if labels is None or round_index >= 2:
        return int(rng.integers(len(placement.batch_of)))
    if round_index == 0:
        return labels.draw_same(row, rng)
    return labels.draw_keeping(row, int(placement.batch_of[row]), placement.batches, placement.batch_of, rng)


class _Labels:
    """The rows' labels for :func:`separate_false_negatives`: rows by label, to draw one of a
    given label, and each batch's label counts, kept up to date through the swaps."""

    def __init__(self, labels: np.ndarray, batches: list[np.ndarray]):
        self.labels = np.asarray(labels)
        self.rows = np.argsort(self.labels, kind="stable")
        ordered = self.labels[self.rows]
        self.starts = np.searchsorted(ordered, self.labels, side="left")
        self.ends = np.searchsorted(ordered, self.labels, side="right")
        self.counts = [Counter(self.labels[rows].tolist()) for rows in batches]

    def draw_same(self, row: int, rng: np.random.Generator) -> int:
        """A random row with ``row``'s label (maybe ``row`` itself)."""
        lo, hi = int(self.starts[row]), int(self.ends[row])
        return int(self.rows[lo + int(rng.integers(hi - lo))])

    def draw_keeping(
        self, row: int, home: int, batches: list[np.ndarray], batch_of: np.ndarray, rng: np.random.Generator
    ) -> int:
        """A random row of a batch that holds ``row``'s label, whose label batch ``home``
        holds; -1 if the one drawn has not."""
        batch = batches[int(batch_of[self.draw_same(row, rng)])]
        other = int(batch[int(rng.integers(len(batch)))])
        return other if self.counts[home][self.labels[other].item()] > 0 else -1

    def swapped(self, row: int, home: int, other: int, away: int) -> None:
        mine, theirs = self.labels[row].item(), self.labels[other].item()
        for batch, gone, came in ((home, mine, theirs), (away, theirs, mine)):
            counts = self.counts[batch]
            counts[gone] -= 1
            if counts[gone] == 0:
                del counts[gone]
            counts[came] += 1
