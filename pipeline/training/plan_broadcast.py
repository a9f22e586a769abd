"""Rank 0's next plan and negatives column, sent to every rank."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch.distributed as dist

from pipeline.batching.plan import BatchPlan
from pipeline.training.refresh_policy import Boundary


def from_rank0(value: Any) -> Any:
    """Every rank's copy of rank 0's ``value`` (what other ranks pass is ignored); the value
    itself without a multi-process group (one worker)."""
    payload = [value]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(payload, src=0)
    return payload[0]


def broadcast_plan(
    chosen: tuple[BatchPlan, np.ndarray | None, Boundary] | None, start: float
) -> tuple[BatchPlan, np.ndarray | None, Boundary]:
    """Every rank's copy of rank 0's next plan, negatives column and boundary.

    Args:
        chosen: rank 0's plan, the rows' negatives column (None: none) and boundary; None on
            the other ranks.
        start: when this rank began the boundary (``time.perf_counter()``).

    Returns:
        Rank 0's plan, negatives and boundary, with ``wait_seconds`` this rank's own wait since
        ``start``. Without a multi-process group (one worker) this is rank 0's own.
    """
    plan_dict, negatives, boundary = from_rank0(
        None if chosen is None else (chosen[0].to_dict(), chosen[1], chosen[2])
    )
    boundary.wait_seconds = time.perf_counter() - start
    return BatchPlan.from_dict(plan_dict), negatives, boundary
