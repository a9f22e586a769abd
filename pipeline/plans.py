"""Batch plans: which corpus rows form each global batch of an epoch.

A plan covers every corpus row exactly once. Batch sizes are balanced (they differ by at
most one), so every epoch has the same number of optimizer steps whatever the plan, and
with ``batch_size >= 2 x num_workers`` every worker gets rows in every batch.

Epoch 1 uses :func:`random_plan`; later epochs use :func:`neighbourhood_plan` over the
miner's k-NN graph, which groups mutually near sentences into a batch so that its in-batch
negatives are hard ones.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass
class BatchPlan:
    version: int
    """0 for the random first epoch, then 1, 2, ... per refresh."""
    rows: np.ndarray
    """``(n,)`` int64 corpus positions, batch after batch."""
    sizes: np.ndarray
    """``(num_batches,)`` int64 rows per batch."""

    @property
    def num_batches(self) -> int:
        return len(self.sizes)

    def batch(self, index: int) -> np.ndarray:
        start = int(self.sizes[:index].sum())
        return self.rows[start : start + int(self.sizes[index])]

    def batches(self) -> list[np.ndarray]:
        return np.split(self.rows, np.cumsum(self.sizes)[:-1])

    def to_dict(self) -> dict:
        return {"version": self.version, "rows": self.rows, "sizes": self.sizes}

    @classmethod
    def from_dict(cls, data: dict) -> BatchPlan:
        return cls(
            int(data["version"]),
            np.asarray(data["rows"], dtype=np.int64),
            np.asarray(data["sizes"], dtype=np.int64),
        )


def balanced_batch_sizes(num_rows: int, batch_size: int) -> np.ndarray:
    """``ceil(n / batch_size)`` batch sizes that sum to n and differ by at most one."""
    if num_rows < batch_size:
        raise ValueError(f"train.batch_size ({batch_size}) is larger than the corpus ({num_rows} sentences)")
    num_batches = -(-num_rows // batch_size)
    sizes = np.full(num_batches, num_rows // num_batches, dtype=np.int64)
    sizes[: num_rows % num_batches] += 1
    return sizes


def worker_slices(batch_len: int, world_size: int) -> list[int]:
    """Rows of one global batch held by each rank (contiguous, rank 0 first)."""
    base, extra = divmod(batch_len, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def random_plan(num_rows: int, batch_size: int, seed: int, version: int = 0) -> BatchPlan:
    rng = np.random.default_rng(seed)
    return BatchPlan(
        version, rng.permutation(num_rows).astype(np.int64), balanced_batch_sizes(num_rows, batch_size)
    )


def neighbourhood_plan(
    neighbours: np.ndarray, scores: np.ndarray, batch_size: int, seed: int, version: int
) -> BatchPlan:
    """Group rows into batches of mutual near neighbours, covering every row once.

    Each batch starts from a random unassigned seed row and grows like Prim's algorithm on
    the k-NN graph: the next row is always the unassigned candidate most similar to any row
    already in the batch. A tight group of paraphrases therefore enters a batch whole before
    the batch reaches for weaker neighbours (breadth-first growth would take the seed's 10th
    neighbour before its first neighbour's nearest and split groups across batches). When
    the neighbourhood runs out, the batch is topped up with unassigned rows in random order.
    Batch order is shuffled.

    Args:
        neighbours: ``(n, k)`` neighbour positions per row, nearest first, with the row
            itself and rows with the same text already removed (marked -1).
        scores: ``(n, k)`` similarity of each neighbour.
        batch_size: target global batch size.
        seed: makes the plan deterministic.
        version: plan version to record.
    """
    num_rows = neighbours.shape[0]
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    visit_order = rng.permutation(num_rows)
    assigned = np.zeros(num_rows, dtype=bool)
    cursor = 0
    batches: list[list[int]] = []
    neighbour_lists = neighbours.tolist()
    score_lists = scores.tolist()

    def next_free() -> int:
        nonlocal cursor
        while assigned[visit_order[cursor]]:
            cursor += 1
        return int(visit_order[cursor])

    def push_neighbours(heap: list[tuple[float, int]], row: int) -> None:
        for candidate, score in zip(neighbour_lists[row], score_lists[row], strict=True):
            if candidate >= 0 and not assigned[candidate]:
                heapq.heappush(heap, (-score, candidate))

    for size in sizes.tolist():
        seed_row = next_free()
        assigned[seed_row] = True
        members = [seed_row]
        heap: list[tuple[float, int]] = []
        push_neighbours(heap, seed_row)
        while heap and len(members) < size:
            _, candidate = heapq.heappop(heap)
            if assigned[candidate]:
                continue
            assigned[candidate] = True
            members.append(candidate)
            push_neighbours(heap, candidate)
        while len(members) < size:
            row = next_free()
            assigned[row] = True
            members.append(row)
        batches.append(members)
    order = rng.permutation(len(batches))
    rows = np.fromiter((r for b in order for r in batches[b]), dtype=np.int64, count=num_rows)
    return BatchPlan(version, rows, sizes[order])


def mean_in_batch_similarity(embeddings: np.ndarray, plan: BatchPlan) -> float:
    """Mean cosine similarity over distinct pairs inside each batch (normalised inputs)."""
    total, pairs = 0.0, 0
    for rows in plan.batches():
        e = embeddings[rows]
        gram = e @ e.T
        m = len(rows)
        total += float(gram.sum() - np.trace(gram))
        pairs += m * (m - 1)
    return total / max(pairs, 1)
