"""Refresh samplers over the k-NN graph beyond ``knn``: random walks with restart (``rwr``) and
neighbour groups among random rows (``mixed``).

Each covers every row once per epoch in :func:`~pipeline.batching.plan.balanced_batch_sizes`
batches (in a random order), keeps flagged false negatives apart
(:mod:`pipeline.batching.separation`) and is deterministic per seed. The inputs are those of
:func:`~pipeline.batching.samplers.neighbourhood_plan`.
"""

from __future__ import annotations

import numpy as np

from pipeline.batching.batch_builder import BatchBuilder
from pipeline.batching.plan import BatchPlan, balanced_batch_sizes
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import shuffled_plan

STUCK_STEPS = 32
"""Steps without a new row after which a walk counts as stuck and jumps to a random
unassigned row: bounds an epoch's walking at ``n x STUCK_STEPS`` steps."""


def random_walk_plan(inputs: SamplerInputs) -> BatchPlan:
    """Batches sampled by random walks with restart on the k-NN graph (``rwr``).

    BatchSampler (Yang et al., KDD 2023, arXiv:2306.03355; the authors' THUDM/BatchSampler
    ``main.py``, ``random_walk``): a batch starts at a random row; at each step the walk goes
    back to the batch's start row with probability ``restart_probability`` (a restart, in
    the reference, appends the walk's first node again; it never jumps elsewhere), else
    moves to a uniformly random neighbour, and every unassigned row it visits joins the
    batch. The reference's ``train.sh`` runs ``--restart_p 0.2`` (its argparse default is
    0.1, decayed per epoch to at least 0.05), so 0.2 is the default here.

    Near 1 the walk samples the start row's direct neighbours (breadth-first); near 0 it is
    a plain random walk drifting along the graph (depth-first). Which gives harder batches
    depends on whether a start's neighbourhood can fill a batch. Measured on 2,000 rows in
    20 synthetic topics, batch 64, mean in-batch cosine: with k = 100 neighbours, 0.07 at
    restart 0, 0.11 at 0.2, 0.13 at 0.5 to 0.95 (knn 0.21); with k = 32 the neighbourhood
    runs out, the walk jumps to unrelated rows, and rare restarts are harder: 0.12 at 0.02
    to 0.2, 0.085 at 0.8, 0.07 at 0.98 (knn 0.19, random batches 0.03).

    To cover every row once per epoch (the reference walks over rows used in earlier
    batches and tops the epoch up at the end), a row joins only if no batch holds it yet
    and it is none of the members' flagged false negatives (nor flags one). When
    :data:`STUCK_STEPS` steps in a row add nothing (the start's neighbourhood is used up),
    the walk jumps to a random unassigned row, which joins and becomes the row restarts go
    back to. The walk moves through assigned rows like any other, as in the reference.

    Cost: at most ``n x STUCK_STEPS`` steps (``O(n x batch)`` for batches of 32 or more),
    O(1) each. Measured at n = 100,000, k = 32, batch 64, one CPU core: 1.1 s with three
    flagged false negatives per row, 0.6 s without.

    Args:
        inputs: ``neighbours`` (``(n, k)`` acceptable negatives per row, nearest first, -1
            elsewhere; the row itself and rows with the same text already removed; their
            ``scores`` are unused: the walk is uniform over neighbours, as in the reference),
            ``batch_size``, ``seed``, ``version``, optional ``false_negatives`` (``(n, k)``
            rows that must not share a batch with the row, -1 elsewhere; checked both ways as
            rows join, swapped apart after in tiny corpora) and ``restart_probability``
            (chance per step to go back to the batch's start row, in [0, 1]).

    Returns:
        The plan, ``version`` and sampler ``rwr`` recorded.
    """
    neighbours, false_negatives, restart_probability = (
        inputs.neighbours,
        inputs.false_negatives,
        inputs.restart_probability,
    )
    batch_size, seed, version = inputs.batch_size, inputs.seed, inputs.version
    if not 0.0 <= restart_probability <= 1.0:
        raise ValueError(f"restart_probability must be in [0, 1] (got {restart_probability})")
    num_rows = neighbours.shape[0]
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    builder = BatchBuilder(num_rows, false_negatives, rng.permutation(num_rows))
    walker = _Walker(neighbours, rng, restart_probability)
    batches = [walker.walk(builder, size) for size in sizes.tolist()]
    return shuffled_plan(batches, false_negatives, rng, version, "rwr")


class _Walker:
    """The walks of :func:`random_walk_plan`.

    Each row's valid neighbours are packed to the front of its row and read through a
    memoryview (a Python int per read, no n x k Python objects), and uniforms are drawn in
    blocks: the loop runs once per step, so its per-step cost is the sampler's cost.
    """

    def __init__(self, neighbours: np.ndarray, rng: np.random.Generator, restart_probability: float):
        valid = neighbours >= 0
        packed = np.take_along_axis(neighbours, np.argsort(~valid, axis=1, kind="stable"), axis=1)
        self.width = neighbours.shape[1]
        self.packed = memoryview(np.ascontiguousarray(packed, dtype=np.int64).reshape(-1))
        self.degree = memoryview(valid.sum(axis=1).astype(np.int64))
        self.rng = rng
        self.restart = restart_probability
        self.uniforms: list[float] = []
        self.used = 0

    def walk(self, builder: BatchBuilder, size: int) -> list[int]:
        """One batch of ``size`` rows, from the first unassigned row of the random order."""
        builder.begin()
        start = builder.next_unassigned()
        assert start is not None  # the sizes sum to n
        builder.add(start)
        # Local names: the loop below runs once per step of every walk.
        members, assigned, can_join = builder.members, builder.assigned, builder.can_join
        packed, degree, width, restart = self.packed, self.degree, self.width, self.restart
        # One uniform decides a step: below ``restart`` restarts, above picks a neighbour,
        # (u - restart) / (1 - restart) being uniform on [0, 1) given u >= restart. At the
        # start row a restart changes nothing, so there the walk always moves (u / restart
        # picking the neighbour): the same walk without its no-op steps, which a restart
        # probability near 1 would otherwise multiply by 1 / (1 - restart) and which would
        # count towards STUCK_STEPS.
        spread = 1.0 - restart
        uniforms, used = self.uniforms, self.used
        anchor = current = start
        idle = 0
        while len(members) < size:
            if used == len(uniforms):
                uniforms, used = self.rng.random(1 << 16).tolist(), 0
            u = uniforms[used]
            used += 1
            if u < restart and current != anchor:
                current = anchor
            elif degree[current]:
                d = degree[current]
                pick = (u - restart) / spread if u >= restart else u / restart
                current = packed[current * width + min(int(pick * d), d - 1)]
                if not assigned[current] and can_join(current):
                    builder.add(current)
                    idle = 0
                    continue
            idle += 1
            if idle >= STUCK_STEPS:
                jump = builder.next_joinable()
                if jump is None:
                    break  # every unassigned row conflicts with the batch: top_up decides
                builder.add(jump)
                anchor = current = jump
                idle = 0
        self.uniforms, self.used = uniforms, used
        builder.top_up(size)
        return members


def mixed_plan(inputs: SamplerInputs) -> BatchPlan:
    """Batches of small neighbour groups among random rows (``mixed``).

    ``round(neighbour_share x batch)`` rows of each batch come in groups: a random
    unassigned row and its ``group_size - 1`` nearest unassigned neighbours that may join
    (fewer where fewer are left); the rest of the batch are random unassigned rows. Each row
    so has a few hard negatives among mostly easy ones, where ``knn`` makes the whole batch
    one neighbourhood. Share 0 gives random batches (consecutive rows of a random order),
    share 1 groups only.

    Args:
        inputs: ``neighbours`` (``(n, k)`` acceptable negatives per row, nearest first, -1
            elsewhere; ``scores`` unused), ``batch_size``, ``seed``, ``version``, optional
            ``false_negatives`` (checked both ways as rows join, swapped apart after in tiny
            corpora), ``mixed_share`` (share of each batch from neighbour groups, in [0, 1])
            and ``mixed_group_size`` (rows per group, its seed row included, >= 1).

    Returns:
        The plan, ``version`` and sampler ``mixed`` recorded.
    """
    neighbours, false_negatives = inputs.neighbours, inputs.false_negatives
    neighbour_share, group_size = inputs.mixed_share, inputs.mixed_group_size
    batch_size, seed, version = inputs.batch_size, inputs.seed, inputs.version
    if not 0.0 <= neighbour_share <= 1.0:
        raise ValueError(f"neighbour_share must be in [0, 1] (got {neighbour_share})")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (got {group_size})")
    num_rows = neighbours.shape[0]
    sizes = balanced_batch_sizes(num_rows, batch_size)
    rng = np.random.default_rng(seed)
    builder = BatchBuilder(num_rows, false_negatives, rng.permutation(num_rows))
    batches = []
    for size in sizes.tolist():
        builder.begin()
        members, assigned = builder.members, builder.assigned
        grouped = round(neighbour_share * size)
        while len(members) < grouped:
            start = builder.next_joinable()
            if start is None:
                break
            builder.add(start)
            group = 1
            for candidate in neighbours[start].tolist():
                if group == group_size or len(members) == grouped:
                    break
                if candidate >= 0 and not assigned[candidate] and builder.can_join(candidate):
                    builder.add(candidate)
                    group += 1
        builder.top_up(size)
        batches.append(members)
    return shuffled_plan(batches, false_negatives, rng, version, "mixed")
