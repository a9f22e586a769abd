"""Batch samplers: the ways an epoch's rows are grouped into batches."""

from __future__ import annotations

import heapq

import numpy as np

from pipeline.batching.plan import BatchPlan, balanced_batch_sizes


def random_plan(
    num_rows: int,
    batch_size: int,
    seed: int,
    version: int = 0,
    lengths: np.ndarray | None = None,
    group_batches: int = 0,
) -> BatchPlan:
    """Every row once, in random batches; with ``lengths`` and ``group_batches >= 2``, length-grouped.

    Grouping (the "megabatch" scheme of Hugging Face's ``group_by_length``): the shuffled rows
    are cut into groups of ``group_batches`` consecutive batches, each group is sorted by
    length, longest first, and cut into its batches again; then the batch order is shuffled
    and the batch holding the longest row goes first, so that a batch too wide for the
    device fails at step 1, not hours in. Batches are padded to their longest row, so
    grouping removes most padding; the cost is that in-batch negatives share a length range.

    Args:
        num_rows: rows to cover.
        batch_size: target global batch size (sizes are balanced, see
            :func:`balanced_batch_sizes`).
        seed: makes the plan deterministic.
        version: plan version to record.
        lengths: ``(num_rows,)`` tokens per row (the padded width a row forces on its batch).
        group_batches: batches per sorted group; 0 (or 1) leaves batches purely random.

    Returns:
        The plan; its batch sizes are the same with and without grouping.
    """
    rng = np.random.default_rng(seed)
    rows = rng.permutation(num_rows).astype(np.int64)
    sizes = balanced_batch_sizes(num_rows, batch_size)
    if lengths is None or group_batches < 2:
        return BatchPlan(version, rows, sizes)
    lengths = np.asarray(lengths)
    if lengths.shape != (num_rows,):
        raise ValueError(f"lengths has shape {lengths.shape}, expected ({num_rows},)")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for first in range(0, len(sizes), group_batches):
        lo, hi = bounds[first], bounds[min(first + group_batches, len(sizes))]
        # Stable, so rows of equal length keep their random order.
        rows[lo:hi] = rows[lo:hi][np.argsort(-lengths[rows[lo:hi]], kind="stable")]
    batches = np.split(rows, bounds[1:-1])
    order = rng.permutation(len(batches))
    widest = int(np.argmax([lengths[batches[i]].max() for i in order]))
    order[[0, widest]] = order[[widest, 0]]
    return BatchPlan(version, np.concatenate([batches[i] for i in order]), sizes[order])


def neighbourhood_plan(
    neighbours: np.ndarray,
    scores: np.ndarray,
    batch_size: int,
    seed: int,
    version: int,
    false_negatives: np.ndarray | None = None,
) -> BatchPlan:
    """Group rows into batches of mutual near neighbours, covering every row once.

    Each batch starts from a random unassigned seed row and grows like Prim's algorithm on
    the k-NN graph: the next row is always the unassigned candidate most similar to any row
    already in the batch. A tight neighbourhood therefore enters a batch whole before the
    batch reaches for weaker neighbours (breadth-first growth would take the seed's 10th
    neighbour before its first neighbour's nearest, and scatter neighbourhoods across
    batches). When the neighbourhood runs out, the batch is topped up with unassigned rows
    in random order. Batch order is shuffled.

    Args:
        neighbours: ``(n, k)`` acceptable negatives per row, nearest first, -1 elsewhere
            (the row itself and rows with the same text already removed).
        scores: ``(n, k)`` similarity of each neighbour.
        batch_size: target global batch size.
        seed: makes the plan deterministic.
        version: plan version to record.
        false_negatives: optional ``(n, k)`` rows that must not share a batch with the row
            (likely paraphrases), -1 elsewhere. Checked both ways: a row joins a batch only
            if it is no member's false negative and no member is its false negative.

    Returns:
        The plan, ``version`` recorded; its batch sizes are :func:`balanced_batch_sizes`'s.
    """
    num_rows = neighbours.shape[0]
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    visit_order = rng.permutation(num_rows)
    builder = _NeighbourhoodBatches(neighbours, scores, false_negatives)
    cursor = 0
    batches: list[list[int]] = []
    for size in sizes.tolist():
        while builder.assigned[visit_order[cursor]]:
            cursor += 1
        batches.append(builder.grow(size, visit_order, cursor))
    order = rng.permutation(len(batches))
    rows = np.fromiter((r for b in order for r in batches[b]), dtype=np.int64, count=num_rows)
    return BatchPlan(version, rows, sizes[order])


class _NeighbourhoodBatches:
    """The batches of :func:`neighbourhood_plan`, grown one at a time over the rows not yet
    assigned to any batch.

    Rows are converted to Python lists on demand, not all at once: every row joins exactly
    one batch, so the work is the same, and memory stays O(batch x k) instead of holding
    n x k Python objects (about 4.5 GB at a million rows with k = 65).
    """

    def __init__(self, neighbours: np.ndarray, scores: np.ndarray, false_negatives: np.ndarray | None):
        self.neighbours = neighbours
        self.scores = scores
        self.false_negatives = false_negatives
        self.assigned = np.zeros(neighbours.shape[0], dtype=bool)
        # The batch being grown: its rows, the same as a set, the rows its members rule out
        # (their false negatives), and the candidates by similarity (a min-heap of -score).
        self.members: list[int] = []
        self.member_set: set[int] = set()
        self.blocked: set[int] = set()
        self.heap: list[tuple[float, int]] = []

    def grow(self, size: int, visit_order: np.ndarray, cursor: int) -> list[int]:
        """One batch of ``size`` rows: ``visit_order[cursor]`` (unassigned) as its seed, then
        the nearest unassigned candidates (Prim's order), then rows from ``visit_order`` on
        from ``cursor``.

        Returns:
            The batch's rows, in the order they joined; they are marked assigned.
        """
        self.members, self.member_set, self.blocked, self.heap = [], set(), set(), []
        # Local names: this loop runs once per candidate of every row (n x k times).
        members, heap, assigned = self.members, self.heap, self.assigned
        self._add(int(visit_order[cursor]))
        while heap and len(members) < size:
            _, candidate = heapq.heappop(heap)
            if not assigned[candidate] and self._can_join(candidate):
                self._add(candidate)
        self._top_up(size, visit_order, cursor)
        return members

    def _top_up(self, size: int, visit_order: np.ndarray, cursor: int) -> None:
        """Fill the batch from the random order, preferring rows that are nobody's false
        negative here; when none is left (tiny corpora), any unassigned row."""
        scan = cursor
        fallback: list[int] = []
        while len(self.members) < size and scan < len(visit_order):
            row = int(visit_order[scan])
            scan += 1
            if self.assigned[row]:
                continue
            if self._can_join(row):
                self._add(row)
            else:
                fallback.append(row)
        for row in fallback:
            if len(self.members) == size:
                break
            self._add(row)

    def _blocked_of(self, row: int) -> list[int]:
        """The rows that must not share a batch with ``row``."""
        assert self.false_negatives is not None
        return [c for c in self.false_negatives[row].tolist() if c >= 0]

    def _can_join(self, row: int) -> bool:
        """Whether ``row`` is no member's false negative and no member is its false negative."""
        if self.false_negatives is None:
            return True
        return row not in self.blocked and self.member_set.isdisjoint(self._blocked_of(row))

    def _add(self, row: int) -> None:
        """Put ``row`` in the batch and its unassigned neighbours on the candidate heap."""
        self.assigned[row] = True
        self.members.append(row)
        self.member_set.add(row)
        if self.false_negatives is not None:
            self.blocked.update(self._blocked_of(row))
        assigned, heap = self.assigned, self.heap
        for candidate, score in zip(self.neighbours[row].tolist(), self.scores[row].tolist(), strict=True):
            if candidate >= 0 and not assigned[candidate]:
                heapq.heappush(heap, (-score, candidate))
