"""The random state an epoch trains with, chosen so that a resumed run repeats the lost steps.

Dropout and Python's ``random`` are seeded per (seed, rank, epoch); the augmentation
generator is a numpy ``Generator`` of the same key. Mid-epoch, a checkpoint of as many
workers carries every rank's generators as they were, and they are restored instead.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from pipeline.training.state import restore_rng


def seed_dropout(seed: int, rank: int, epoch: int) -> None:
    """Dropout randomness from (seed, rank, epoch): ranks differ, and a run resumed at an
    epoch boundary draws exactly what the uninterrupted run would have drawn."""
    torch.manual_seed(seed + 1_000_003 * rank + 7919 * epoch)
    random.seed(seed + rank + epoch)


def seed_epoch(
    seed: int, *, rank: int, world: int, epoch: int, first_batch: int, saved: list[dict[str, Any]] | None
) -> np.random.Generator:
    """Seed dropout and Python's random for the part of epoch ``epoch`` this run trains (from
    ``first_batch``), and return its augmentation generator.

    From the epoch's start: seeded from (seed, rank, epoch). Mid-epoch, from a checkpoint of
    as many workers (``saved``: one entry per rank): every generator as the checkpoint
    captured it, so the redone steps repeat the lost ones. On another number of workers: a
    fresh but still seeded stream."""
    augment_rng = np.random.default_rng([seed, rank, epoch])
    if first_batch == 0:
        seed_dropout(seed, rank, epoch)
    elif saved is not None and len(saved) == world:
        restore_rng(saved[rank], augment_rng)
    else:
        seed_dropout(seed, rank, epoch + 104_729 * first_batch)
        augment_rng = np.random.default_rng([seed, rank, epoch, first_batch])
    return augment_rng
