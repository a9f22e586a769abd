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
    """
    num_rows = neighbours.shape[0]
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    visit_order = rng.permutation(num_rows)
    assigned = np.zeros(num_rows, dtype=bool)
    cursor = 0
    batches: list[list[int]] = []
    # Rows are converted to Python lists on demand, not all at once: every row joins exactly
    # one batch, so the work is the same, and memory stays O(batch x k) instead of holding
    # n x k Python objects (about 4.5 GB at a million rows with k = 65).

    def blocked_of(row: int) -> list[int]:
        assert false_negatives is not None
        return [c for c in false_negatives[row].tolist() if c >= 0]

    for size in sizes.tolist():
        members: list[int] = []
        member_set: set[int] = set()
        blocked: set[int] = set()
        heap: list[tuple[float, int]] = []

        def can_join(row: int, member_set: set[int] = member_set, blocked: set[int] = blocked) -> bool:
            if false_negatives is None:
                return True
            return row not in blocked and member_set.isdisjoint(blocked_of(row))

        def add(
            row: int,
            members: list[int] = members,
            member_set: set[int] = member_set,
            blocked: set[int] = blocked,
            heap: list = heap,
        ) -> None:
            assigned[row] = True
            members.append(row)
            member_set.add(row)
            if false_negatives is not None:
                blocked.update(blocked_of(row))
            for candidate, score in zip(neighbours[row].tolist(), scores[row].tolist(), strict=True):
                if candidate >= 0 and not assigned[candidate]:
                    heapq.heappush(heap, (-score, candidate))

        while assigned[visit_order[cursor]]:
            cursor += 1
        add(int(visit_order[cursor]))
        while heap and len(members) < size:
            _, candidate = heapq.heappop(heap)
            if not assigned[candidate] and can_join(candidate):
                add(candidate)
        # Top up from the random order, preferring rows that are nobody's false negative here;
        # when none is left (tiny corpora), any unassigned row.
        scan = cursor
        fallback: list[int] = []
        while len(members) < size and scan < num_rows:
            row = int(visit_order[scan])
            scan += 1
            if assigned[row]:
                continue
            if can_join(row):
                add(row)
            else:
                fallback.append(row)
        for row in fallback:
            if len(members) == size:
                break
            add(row)
        batches.append(members)
    order = rng.permutation(len(batches))
    rows = np.fromiter((r for b in order for r in batches[b]), dtype=np.int64, count=num_rows)
    return BatchPlan(version, rows, sizes[order])
