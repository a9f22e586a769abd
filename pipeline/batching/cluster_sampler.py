"""The ``clusters`` refresh sampler: batches drawn from a few k-means clusters each, flagged
false negatives of a cluster placed in different batches of it.

Like the other samplers it covers every row once per epoch in
:func:`~pipeline.batching.plan.balanced_batch_sizes` batches (in a random order) and is
deterministic per seed.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph
from pipeline.batching.plan import BatchPlan, balanced_batch_sizes
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import shuffled_plan


def cluster_plan(inputs: SamplerInputs) -> BatchPlan:
    """Batches drawn from about ``clusters_per_batch`` k-means clusters each (``clusters``).

    ClusterNS (Deng et al., Findings of ACL 2023) uses k-means clusters of the sentence
    embeddings to find hard negatives (rows of nearby clusters) and likely false negatives
    (rows of one's own cluster). Here the clusters decide the batches: in-batch negatives
    are then mostly rows of a few topics, i.e. hard, while flagged false negatives (usually
    of one cluster) go to different batches of their cluster.

    First how many rows of which cluster each batch takes: clusters are visited in a random
    order through ``clusters_per_batch`` lanes that each hold one open cluster; a batch
    takes about ``batch / clusters_per_batch`` rows from each lane, or all that is left of a
    lane's cluster when less (the other lanes make up the difference), so a batch usually
    holds exactly ``clusters_per_batch`` clusters; only when every lane runs out at once
    does it open more (clusters smaller than a lane's share mean more clusters per batch).
    Then which rows: each cluster's rows, those with the most flagged partners first (ties
    in random order), each go to the batch of their cluster with the most room left that
    holds none of their partners (greedy largest-first colouring). A row with no such batch
    goes where there is most room, and is swapped apart afterwards: with a row of its own
    cluster where possible, else one that adds no cluster to either batch, else any row
    (flags denser than a cluster's batches can separate; it adds a cluster to two batches).
    Rows are shuffled within each batch, so every worker's slice mixes the batch's clusters.

    Args:
        inputs: ``clusters`` (``(n,)`` int cluster of each row, any ids; required),
            ``batch_size``, ``seed``, ``version``, optional ``false_negatives`` (``(n, m)``
            rows that must not share a batch with the row, -1 elsewhere; pairs that cannot be
            placed apart, in a corpus too small or too densely flagged, stay together) and
            ``clusters_per_batch`` (lanes, i.e. clusters a batch is drawn from, >= 1).

    Returns:
        The plan, ``version`` and sampler ``clusters`` recorded.
    """
    if inputs.clusters is None:
        raise ValueError("the clusters sampler needs the refresh's k-means clusters")
    clusters, false_negatives, clusters_per_batch = (
        inputs.clusters,
        inputs.false_negatives,
        inputs.clusters_per_batch,
    )
    batch_size, seed, version = inputs.batch_size, inputs.seed, inputs.version
    clusters = np.asarray(clusters)
    if clusters.ndim != 1:
        raise ValueError(f"clusters must be (n,), got shape {clusters.shape}")
    if clusters_per_batch < 1:
        raise ValueError(f"clusters_per_batch must be >= 1 (got {clusters_per_batch})")
    num_rows = len(clusters)
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    _, label = np.unique(clusters, return_inverse=True)
    label = label.reshape(-1)
    num_clusters = int(label.max()) + 1
    # pieces[c]: (batch, rows) of cluster c, the clusters visited in a random order.
    pieces: list[list[tuple[int, int]]] = [[] for _ in range(num_clusters)]
    lanes = _Lanes(rng.permutation(num_clusters).tolist(), np.bincount(label).tolist(), clusters_per_batch)
    for batch, size in enumerate(sizes.tolist()):
        for cluster, count in lanes.take(size):
            pieces[cluster].append((batch, count))
    graph = FalseNegativeGraph(false_negatives) if false_negatives is not None else None
    degree = graph.degree() if graph is not None else np.zeros(num_rows, dtype=np.int64)
    # Rows by (cluster, most partners first, random).
    order = np.lexsort((rng.random(num_rows), -degree, label))
    bounds = np.concatenate([[0], np.cumsum(np.bincount(label, minlength=num_clusters))]).tolist()
    batch_of = np.full(num_rows, -1, dtype=np.int64)
    for cluster in range(num_clusters):
        _place(order[bounds[cluster] : bounds[cluster + 1]].tolist(), pieces[cluster], graph, batch_of)
    grouped = np.lexsort((rng.random(num_rows), batch_of))
    batches = np.split(grouped, np.cumsum(sizes)[:-1])
    return shuffled_plan(batches, false_negatives, rng, version, "clusters", like=clusters)


def _place(
    rows: list[int], pieces: list[tuple[int, int]], graph: FalseNegativeGraph | None, batch_of: np.ndarray
) -> None:
    """Put one cluster's ``rows`` into its ``pieces`` (``(batch, rows)``), setting ``batch_of``:
    each row into the piece with the most room whose batch holds none of its partners, else
    (a conflict for :func:`~pipeline.batching.separation.separate_false_negatives`) the piece
    with the most room."""
    heap = [(-room, batch) for batch, room in pieces]
    heapq.heapify(heap)
    for row in rows:
        partner_batches = set(batch_of[graph.partners(row)].tolist()) if graph is not None else set()
        # Pieces whose batch holds a partner, popped aside: at most one per partner.
        aside = []
        while heap and heap[0][1] in partner_batches:
            aside.append(heapq.heappop(heap))
        room, batch = heapq.heappop(heap) if heap else aside.pop(0)
        batch_of[row] = batch
        if room < -1:
            heapq.heappush(heap, (room + 1, batch))
        for entry in aside:
            heapq.heappush(heap, entry)


class _Lanes:
    """The open clusters :func:`cluster_plan` draws batches from, as ``[cluster, rows left]``."""

    def __init__(self, visit_order: list[int], cluster_sizes: list[int], count: int):
        self.queue = deque(visit_order)
        self.cluster_sizes = cluster_sizes
        self.count = count
        self.open: list[list[int]] = []
        self._refill()

    def take(self, size: int) -> list[tuple[int, int]]:
        """How many rows one batch of ``size`` takes from which cluster (lanes it empties close)."""
        lanes = self.open
        share, extra = divmod(size, max(len(lanes), 1))
        give = [min(share + (1 if j < extra else 0), left) for j, (_, left) in enumerate(lanes)]
        short = size - sum(give)
        # Lanes with rows to spare make up for those that ran out, fullest first, up to half
        # a share more each: lopsided pieces make a batch one cluster with a few strays, and
        # leave a cluster's flagged pairs too few other batches to be placed apart.
        cap = share + max(share // 2, 1)
        for j in sorted(range(len(lanes)), key=lambda j: give[j] - lanes[j][1]):
            if short == 0:
                break
            more = min(short, lanes[j][1] - give[j], max(cap - give[j], 0))
            give[j] += more
            short -= more
        pieces = [(cluster, g) for (cluster, _), g in zip(lanes, give, strict=True) if g]
        self.open = [[cluster, left - g] for (cluster, left), g in zip(lanes, give, strict=True) if left > g]
        # Rows still missing come from the next clusters, which stay open as lanes; once
        # every cluster is open, from the open lanes beyond the cap.
        while short > 0:
            if self.queue:
                cluster = self.queue.popleft()
                lane = [cluster, self.cluster_sizes[cluster]]
                self.open.append(lane)
            else:
                lane = max(self.open, key=lambda lane: lane[1])  # rows are left: sizes sum to n
            more = min(short, lane[1])
            pieces.append((lane[0], more))
            lane[1] -= more
            short -= more
            self.open = [lane for lane in self.open if lane[1] > 0]
        self._refill()
        return pieces

    def _refill(self) -> None:
        while len(self.open) < self.count and self.queue:
            cluster = self.queue.popleft()
            self.open.append([cluster, self.cluster_sizes[cluster]])
