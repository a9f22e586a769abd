"""Where rank 0's next plan comes from, sent to every rank (a few numbers and URIs, never the plan)."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from pipeline.training.plan_source import PlanSource
from pipeline.training.refresh_policy import Boundary


def from_rank0(value: Any) -> Any:
    """Every rank's copy of rank 0's ``value`` (what other ranks pass is ignored); the value
    itself without a multi-process group (one worker)."""
    payload = [value]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(payload, src=0)
    return payload[0]


def broadcast_plan(chosen: tuple[PlanSource, Boundary] | None, start: float) -> tuple[PlanSource, Boundary]:
    """Every rank's copy of rank 0's next plan source and boundary.

    Args:
        chosen: rank 0's :class:`PlanSource` and boundary; None on the other ranks.
        start: when this rank began the boundary (``time.perf_counter()``).

    Returns:
        Rank 0's source and boundary, with ``wait_seconds`` this rank's own wait since
        ``start``. Without a multi-process group (one worker) this is rank 0's own.
    """
    source, boundary = from_rank0(chosen)
    boundary.wait_seconds = time.perf_counter() - start
    return source, boundary
