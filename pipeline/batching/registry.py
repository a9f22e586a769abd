"""Every batch sampler by name: the one place a sampler is declared.

Config validation (``mining.batch_sampler``'s allowed values), the miner's factory
(:func:`build_plan`) and the docs table (docs/configuration.md, held to :data:`SAMPLERS` by
tests/batching/test_registry.py) all read this. A new sampler is one entry here plus its
function in :mod:`~pipeline.batching.samplers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.batching.plan import BatchPlan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.batching.samplers import neighbourhood_plan, random_plan


@dataclass(frozen=True)
class Sampler:
    name: str
    summary: str
    """One line for the docs table."""
    build: Callable[[SamplerInputs], BatchPlan]


SAMPLERS: dict[str, Sampler] = {
    s.name: s
    for s in (
        Sampler(
            "random", "random batches, each row's flagged false negatives kept apart",
            lambda i: random_plan(
                len(i.neighbours), i.batch_size, i.seed, version=i.version,
                false_negatives=i.false_negatives, sizes=i.batch_sizes(),
            ),
        ),
        Sampler(
            "knn", "each batch grown from a random seed row through its nearest neighbours (Prim's order)",
            neighbourhood_plan,
        ),
    )
}  # fmt: skip
SAMPLER_NAMES: tuple[str, ...] = tuple(SAMPLERS)


def build_plan(name: str, inputs: SamplerInputs) -> BatchPlan:
    """The plan of the sampler called ``name``."""
    if name not in SAMPLERS:
        raise ValueError(f"mining.batch_sampler must be one of {', '.join(SAMPLER_NAMES)} (got {name!r})")
    return SAMPLERS[name].build(inputs)
