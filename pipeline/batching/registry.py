"""Every batch sampler by name: the one place a sampler is declared.

Config validation (``mining.batch_sampler``'s allowed values), the miner's factory
(:func:`build_plan`) and the docs table (docs/configuration.md, held to :data:`SAMPLERS` by
tests/batching/test_registry.py) all read this. A new sampler is one entry here plus its
function in :mod:`~pipeline.batching.samplers`, :mod:`~pipeline.batching.graph_samplers` or
:mod:`~pipeline.batching.cluster_sampler`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.batching.cluster_sampler import cluster_plan
from pipeline.batching.graph_samplers import mixed_plan, random_walk_plan
from pipeline.batching.plan import BatchPlan
from pipeline.batching.samplers import neighbourhood_plan, random_plan


@dataclass(frozen=True)
class SamplerInputs:
    """What any sampler may draw on for one refresh (each uses what it needs)."""

    neighbours: np.ndarray
    """``(n, k)`` each row's nearest neighbours after the filters, -1 padded."""
    scores: np.ndarray
    """``(n, k)`` their cosine similarities."""
    false_negatives: np.ndarray | None
    """``(n, k)`` each row's flagged likely false negatives (kept out of its batch), -1
    elsewhere; None: none flagged."""
    batch_size: int
    seed: int
    version: int
    clusters: np.ndarray | None = None
    """``(n,)`` k-means cluster per row, for samplers with ``needs_clusters``."""
    restart_probability: float = 0.2
    clusters_per_batch: int = 4
    mixed_share: float = 0.5
    mixed_group_size: int = 4


@dataclass(frozen=True)
class Sampler:
    name: str
    summary: str
    """One line for the docs table."""
    build: Callable[[SamplerInputs], BatchPlan]
    needs_clusters: bool = False


def _clusters(inputs: SamplerInputs) -> BatchPlan:
    if inputs.clusters is None:
        raise ValueError("the clusters sampler needs the refresh's k-means clusters")
    return cluster_plan(inputs.clusters, inputs.batch_size, inputs.seed, inputs.version, inputs.false_negatives,
                        clusters_per_batch=inputs.clusters_per_batch)  # fmt: skip


SAMPLERS: dict[str, Sampler] = {
    s.name: s
    for s in (
        Sampler(
            "random", "random batches, each row's flagged false negatives kept apart",
            lambda i: random_plan(len(i.neighbours), i.batch_size, i.seed, i.version, false_negatives=i.false_negatives),
        ),
        Sampler(
            "knn", "each batch grown from a random seed row through its nearest neighbours (Prim's order)",
            lambda i: neighbourhood_plan(i.neighbours, i.scores, i.batch_size, i.seed, i.version, i.false_negatives),
        ),
        Sampler(
            "rwr", "a random walk with restart on the k-NN graph (BatchSampler, KDD 2023)",
            lambda i: random_walk_plan(i.neighbours, i.scores, i.batch_size, i.seed, i.version, i.false_negatives,
                                       restart_probability=i.restart_probability),
        ),
        Sampler(
            "clusters", "FAISS k-means over the refreshed embeddings, each batch from clusters_per_batch clusters",
            _clusters, needs_clusters=True,
        ),
        Sampler(
            "mixed", "mixed_share of each batch from neighbour groups of mixed_group_size, the rest random",
            lambda i: mixed_plan(i.neighbours, i.scores, i.batch_size, i.seed, i.version, i.false_negatives,
                                 neighbour_share=i.mixed_share, group_size=i.mixed_group_size),
        ),
    )
}  # fmt: skip
SAMPLER_NAMES: tuple[str, ...] = tuple(SAMPLERS)


def build_plan(name: str, inputs: SamplerInputs) -> BatchPlan:
    """The plan of the sampler called ``name``."""
    if name not in SAMPLERS:
        raise ValueError(f"mining.batch_sampler must be one of {', '.join(SAMPLER_NAMES)} (got {name!r})")
    return SAMPLERS[name].build(inputs)
