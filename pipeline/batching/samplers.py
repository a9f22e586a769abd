"""Batch samplers: the ways an epoch's rows are grouped into batches."""

from __future__ import annotations

import heapq

import numpy as np

from pipeline.batching.batch_builder import BatchBuilder
from pipeline.batching.false_negative_graph import FalseNegativeGraph
from pipeline.batching.plan import BatchPlan, balanced_batch_sizes
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.separation import separate_false_negatives
from pipeline.core.positions import position_dtype


def random_plan(
    num_rows: int,
    batch_size: int,
    seed: int,
    *,
    version: int = 0,
    lengths: np.ndarray | None = None,
    group_batches: int = 0,
    false_negatives: np.ndarray | FalseNegativeGraph | None = None,
    sizes: np.ndarray | None = None,
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
        false_negatives: optional ``(num_rows, m)`` rows that must not share a batch with the
            row, -1 elsewhere (or their :class:`FalseNegativeGraph`): pairs the random cut puts together are swapped apart
            (:func:`separate_false_negatives`; grouped, preferably with a row of the same
            length, so padding is unchanged). None: the plan is exactly the one without it.
        sizes: the batch sizes, summing to ``num_rows``; None: :func:`balanced_batch_sizes`.

    Returns:
        The plan; its batch sizes are the same with and without grouping.
    """
    rng = np.random.default_rng(seed)
    # rng.permutation(num_rows) shuffles an int64 arange; shuffling one in the positions' dtype
    # draws the same order (and leaves rng where it would) without an int64 copy of the plan.
    rows = np.arange(num_rows, dtype=position_dtype(num_rows))
    rng.shuffle(rows)
    sizes = balanced_batch_sizes(num_rows, batch_size) if sizes is None else sizes
    if lengths is None or group_batches < 2:
        if false_negatives is None:
            return BatchPlan(version, rows, sizes)
        batches, _ = separate_false_negatives(np.split(rows, np.cumsum(sizes)[:-1]), false_negatives, rng)
        return BatchPlan(version, np.concatenate(batches), sizes)
    lengths = np.asarray(lengths)
    if lengths.shape != (num_rows,):
        raise ValueError(f"lengths has shape {lengths.shape}, expected ({num_rows},)")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for first in range(0, len(sizes), group_batches):
        lo, hi = bounds[first], bounds[min(first + group_batches, len(sizes))]
        # Stable, so rows of equal length keep their random order.
        rows[lo:hi] = rows[lo:hi][np.argsort(-lengths[rows[lo:hi]], kind="stable")]
    batches = np.split(rows, bounds[1:-1])
    # After the sort: separating first would be undone by re-cutting the groups.
    batches, _ = separate_false_negatives(batches, false_negatives, rng, like=lengths)
    order = rng.permutation(len(batches))
    widest = int(np.argmax([lengths[batches[i]].max() for i in order]))
    order[[0, widest]] = order[[widest, 0]]
    return BatchPlan(version, np.concatenate([batches[i] for i in order]), sizes[order])


def neighbourhood_plan(inputs: SamplerInputs) -> BatchPlan:
    """Group rows into batches of mutual near neighbours, covering every row once (``knn``).

    Each batch starts from a random unassigned seed row and grows like Prim's algorithm on
    the k-NN graph: the next row is always the unassigned candidate most similar to any row
    already in the batch. A tight neighbourhood therefore enters a batch whole before the
    batch reaches for weaker neighbours (breadth-first growth would take the seed's 10th
    neighbour before its first neighbour's nearest, and scatter neighbourhoods across
    batches). When the neighbourhood runs out, the batch is topped up with unassigned rows
    in random order. Batch order is shuffled.

    Args:
        inputs: ``neighbours`` (``(n, k)`` acceptable negatives per row, nearest first, -1
            elsewhere; the row itself and rows with the same text already removed), their
            ``scores``, ``batch_size`` (the target global batch) or ``sizes``, ``seed`` (makes the plan
            deterministic), ``version`` (recorded), and optional ``false_negatives``:
            ``(n, k)`` rows that must not share a batch with the row
            (likely paraphrases), -1 elsewhere. Checked both ways: a row joins a batch only
            if it is no member's false negative and no member is its false negative. Only a
            corpus too small to place every pair apart (the last batches' top-up) can leave
            a pair together; :func:`separate_false_negatives` then swaps it out if it can.

    Returns:
        The plan, ``version`` and sampler ``knn`` recorded; its batch sizes are
        :meth:`SamplerInputs.batch_sizes`.
    """
    neighbours, scores, false_negatives = inputs.neighbours, inputs.scores, inputs.false_negatives
    seed, version = inputs.seed, inputs.version
    num_rows = neighbours.shape[0]
    sizes = inputs.batch_sizes()
    rng = np.random.default_rng(seed)
    builder = _NeighbourhoodBatches(neighbours, scores, false_negatives, rng.permutation(num_rows))
    batches = [builder.grow(size) for size in sizes.tolist()]
    return shuffled_plan(batches, false_negatives, rng, version, "knn")


def shuffled_plan(
    batches: list[list[int]] | list[np.ndarray],
    false_negatives: np.ndarray | None,
    rng: np.random.Generator,
    version: int,
    sampler: str,
) -> BatchPlan:
    """The plan of ``batches`` in a random order, flagged pairs first swapped apart.

    Args:
        batches: the batches, covering rows ``0..n-1`` once each.
        false_negatives: optional ``(n, m)`` flagged rows, -1 elsewhere (see
            :func:`separate_false_negatives`; pairs it cannot separate stay in the plan).
        rng: the sampler's generator, drawn for the separation (only when a pair shares a
            batch) and the order.
        version: plan version to record.
        sampler: the sampler's name to record.

    Returns:
        The plan.
    """
    separated, _ = separate_false_negatives([np.asarray(b) for b in batches], false_negatives, rng)
    order = rng.permutation(len(separated))
    rows = np.concatenate([separated[b] for b in order]).astype(np.int64)
    sizes = np.array([len(separated[b]) for b in order], dtype=np.int64)
    return BatchPlan(version, rows, sizes, sampler=sampler)


class _NeighbourhoodBatches(BatchBuilder):
    """The batches of :func:`neighbourhood_plan`, grown one at a time over the rows not yet
    assigned to any batch."""

    def __init__(
        self,
        neighbours: np.ndarray,
        scores: np.ndarray,
        false_negatives: np.ndarray | None,
        visit_order: np.ndarray,
    ):
        super().__init__(neighbours.shape[0], false_negatives, visit_order)
        self.neighbours = neighbours
        self.scores = scores
        # The candidates of the batch being grown by similarity (a min-heap of -score).
        self.heap: list[tuple[float, int]] = []

    def grow(self, size: int) -> list[int]:
        """One batch of ``size`` rows: the first unassigned row of the random order as its
        seed, then the nearest unassigned candidates (Prim's order), then random rows.

        Returns:
            The batch's rows, in the order they joined; they are marked assigned.
        """
        self.begin()
        self.heap = []
        # Local names: this loop runs once per candidate of every row (n x k times).
        members, heap, assigned = self.members, self.heap, self.assigned
        seed_row = self.next_unassigned()
        assert seed_row is not None  # the sizes sum to n
        self.add(seed_row)
        while heap and len(members) < size:
            _, candidate = heapq.heappop(heap)
            if not assigned[candidate] and self.can_join(candidate):
                self.add(candidate)
        self.top_up(size)
        return members

    def add(self, row: int) -> None:
        """Put ``row`` in the batch and its unassigned neighbours on the candidate heap."""
        super().add(row)
        assigned, heap = self.assigned, self.heap
        for candidate, score in zip(self.neighbours[row].tolist(), self.scores[row].tolist(), strict=True):
            if candidate >= 0 and not assigned[candidate]:
                heapq.heappush(heap, (-score, candidate))
