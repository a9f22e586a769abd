"""In-batch false-negative debiasing (DCLR / ClusterNS style): which in-batch candidates of a
global batch are likely paraphrases of the anchor, so the loss masks or down-weights them.

The miner ships the hints with the plan (:attr:`~pipeline.batching.plan.BatchPlan.paraphrases`
for ``mining.debias: threshold``, :attr:`~pipeline.batching.plan.BatchPlan.clusters` for
``cluster``). Every rank holds the same plan, so every rank computes the same mask of the
global batch (:func:`false_negative_mask`); :func:`pipeline.training.losses.simcse_loss`
applies it with ``mining.debias_weight``.
"""

from __future__ import annotations

import numpy as np

from pipeline.batching.plan import BatchPlan

RULES = ("none", "threshold", "cluster")

__all__ = ["RULES", "false_negative_mask", "flagged_pairs_in_batches"]


def false_negative_mask(rows: np.ndarray, plan: BatchPlan, rule: str) -> np.ndarray | None:
    """The likely false negatives among a global batch's in-batch candidates.

    Args:
        rows: ``(b,)`` corpus positions of the global batch, rank 0's rows first (a slice of
            ``plan.rows``).
        plan: the epoch's plan, carrying the miner's hints.
        rule: ``mining.debias``: ``none``, ``threshold`` (row j is flagged for row i when it is
            in ``plan.paraphrases[rows[i]]``, or i is in ``plan.paraphrases[rows[j]]``: the
            relation is made symmetric, as similarity is) or ``cluster`` (rows i and j share a
            k-means cluster, ``plan.clusters``; a negative cluster id means "no cluster").

    Returns:
        ``(b, b)`` bool, True at (i, j) when row j is a likely false negative of row i; the
        diagonal (each row's own positive) is always False. None when ``rule`` is ``none``
        or the plan carries no hint for it (epoch 1's random plan): no debiasing.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"mining.debias must be one of {', '.join(RULES)} (got {rule!r})")
    rows = np.asarray(rows, dtype=np.int64)
    b = len(rows)
    if rule == "threshold" and plan.paraphrases is not None:
        mask = _paraphrase_pairs(rows, plan.paraphrases[rows])
    elif rule == "cluster" and plan.clusters is not None:
        cluster = plan.clusters[rows]
        mask = (cluster[:, None] == cluster[None, :]) & (cluster >= 0)[:, None]
    else:
        return None
    mask[np.arange(b), np.arange(b)] = False  # never a row's own positive
    return mask


def _paraphrase_pairs(rows: np.ndarray, paraphrases: np.ndarray) -> np.ndarray:
    """``(b, b)`` bool: True at (i, j) and (j, i) when ``rows[j]`` is among ``paraphrases[i]``
    (symmetric, as similarity is; each row's hint list is a one-sided top-k cut, so j may
    list i without i listing j).

    A plan's batch holds each corpus row once, but a repeated row is handled too (every
    position holding it is flagged). Sorting the batch and binary-searching each hint costs
    O(b m log b), a few ms at b=1024, m=64; the broadcast comparison of every hint with every
    row would be a ``(b, m, b)`` array (64 M entries).
    """
    b = len(rows)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    anchor, slot = np.nonzero(paraphrases >= 0)
    hint = paraphrases[anchor, slot]
    lo = np.searchsorted(ordered, hint, side="left")
    if b < 2 or (ordered[1:] != ordered[:-1]).all():
        # Distinct rows (a plan's batch): each hint is in the batch at most once.
        counts = (ordered[np.minimum(lo, b - 1)] == hint).astype(np.int64)
    else:
        counts = np.searchsorted(ordered, hint, side="right") - lo
    # Expand each hint into the batch positions holding that row.
    starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
    positions = order[starts + np.arange(int(counts.sum()))]
    anchors = np.repeat(anchor, counts)
    mask = np.zeros((b, b), dtype=bool)
    mask[anchors, positions] = True
    mask[positions, anchors] = True  # cheaper than OR-ing in the transpose at b=1024
    return mask


def flagged_pairs_in_batches(plan: BatchPlan, rule: str) -> int:
    """Unordered pairs of rows, over all the plan's batches, that the loss will treat as
    likely false negatives of each other (:func:`false_negative_mask`, each pair once).

    Args:
        plan: an epoch's plan.
        rule: ``mining.debias``.

    Returns:
        The number of flagged pairs; 0 when the rule or the plan gives no mask.
    """
    total = 0
    for batch in plan.batches():
        mask = false_negative_mask(batch, plan, rule)
        if mask is not None:
            total += int(np.count_nonzero(mask)) // 2  # symmetric, diagonal False
    return total
