"""The parts of separate_false_negatives, each on a hand-made case: the placement the swaps
change, when a swap is safe, and which row each round draws."""

from __future__ import annotations

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph
from pipeline.batching.separation import (
    Placement,
    _Labels,
    draw_swap_partner,
    separate_false_negatives,
    swap_keeps_apart,
)

BATCHES = [np.array([0, 1, 2]), np.array([3, 4, 5])]


def _graph(pairs: list[tuple[int, int]], n: int = 6) -> FalseNegativeGraph:
    flagged = np.full((n, 2), -1)
    for row, partner in pairs:
        flagged[row, (flagged[row] >= 0).sum()] = partner
    return FalseNegativeGraph(flagged)


def test_placement_swap_keeps_batches_rows_and_positions_consistent():
    placement = Placement.of(BATCHES)
    placement.swap(1, 5)
    assert [b.tolist() for b in placement.batches] == [[0, 5, 2], [3, 4, 1]]
    for index, rows in enumerate(placement.batches):
        assert (placement.batch_of[rows] == index).all()
        assert (placement.position[rows] == np.arange(len(rows))).all()
    assert [b.tolist() for b in BATCHES] == [[0, 1, 2], [3, 4, 5]]  # the caller's batches are untouched


def test_a_swap_is_safe_only_when_it_creates_no_new_conflict():
    placement = Placement.of(BATCHES)
    graph = _graph([(0, 1), (3, 2)])  # 0-1 share batch 0; 2 must stay apart from 3
    assert conflicts(placement, graph) == [(0, 1)]
    assert swap_keeps_apart(placement, graph, 0, 4)  # 0 joins {3, 5}: no partner there
    assert not swap_keeps_apart(placement, graph, 0, 3)  # 3 would land beside 2, its partner
    assert not swap_keeps_apart(placement, graph, 0, 2)  # same batch: no swap
    assert not swap_keeps_apart(placement, _graph([(0, 1), (0, 4)]), 0, 5)  # 0 would meet 4


def conflicts(placement: Placement, graph: FalseNegativeGraph) -> list[tuple[int, int]]:
    together = placement.conflicts(graph)
    return list(zip(graph.src[together].tolist(), graph.dst[together].tolist(), strict=True))


def test_each_round_draws_from_its_own_pool():
    labels_of = np.array([0, 0, 1, 1, 2, 0])
    placement = Placement.of(BATCHES)
    labels = _Labels(labels_of, placement.batches)
    rng = np.random.default_rng(0)
    same = {draw_swap_partner(0, 0, placement, labels, rng) for _ in range(50)}
    assert same == {0, 1, 5}  # round 0: rows of row 0's label
    keeping = {draw_swap_partner(0, 1, placement, labels, rng) for _ in range(200)} - {-1}
    # Round 1: rows of a batch holding label 0 (both do) whose label batch 0 holds (0 or 1).
    assert keeping and all(labels_of[r] in (0, 1) for r in keeping)
    assert {draw_swap_partner(0, 2, placement, labels, rng) for _ in range(200)} == set(range(6))
    assert {draw_swap_partner(0, 0, placement, None, rng) for _ in range(200)} == set(range(6))


def test_separation_moves_flagged_pairs_apart_and_keeps_sizes():
    graph_pairs = np.array([[1, -1], [-1, -1], [-1, -1], [4, -1], [-1, -1], [-1, -1]])
    out, left = separate_false_negatives(BATCHES, graph_pairs, np.random.default_rng(3))
    assert left == 0 and [len(b) for b in out] == [3, 3]
    assert sorted(np.concatenate(out).tolist()) == list(range(6))
    batch_of = {row: i for i, rows in enumerate(out) for row in rows.tolist()}
    assert batch_of[0] != batch_of[1] and batch_of[3] != batch_of[4]
