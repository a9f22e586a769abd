"""Rows that share a text, to be kept in different batches: sentence-transformers'
``NO_DUPLICATES`` batches for pairs training.

A headline with several paraphrases gives several rows with the same anchor. In one batch
they are each other's known positives, so the loss masks them (a row's positive is never
another row's negative) and each of those rows trains against fewer negatives. Flagging such
rows as each other's false negatives lets :func:`~pipeline.batching.separation.separate_false_negatives`
swap them into different batches, which no-duplicates batches achieve by deferring rows.
"""

from __future__ import annotations

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph

MAX_PARTNERS = 256
"""Most rows listed per row. A text shared by more rows than that is flagged along a ring
(each row with the next ``MAX_PARTNERS`` of the text's group; read both ways, each member is
then kept from ``2 x MAX_PARTNERS`` of them), which keeps the matrix at ``(n, 256)`` at most.
So many rows of one text could not all be apart anyway unless there were more batches than
rows in the group. It also bounds the pairs: at most ``MAX_PARTNERS`` a row, stored sparse
(a dense ``(n, 256)`` matrix would be 20 GB at 10M rows)."""


def rows_sharing_a_text(texts: np.ndarray, max_partners: int = MAX_PARTNERS) -> FalseNegativeGraph | None:
    """For each row, the other rows that hold one of its texts.

    Args:
        texts: ``(n, k)`` text positions of each row (anchor, positive, given negative) in a
            de-duplicated text table, so equal texts have equal positions; -1 where absent.
        max_partners: most partners listed per row (see :data:`MAX_PARTNERS`).

    Returns:
        Each row's partners (other rows sharing at least one text with it, at most
        ``max_partners`` listed by a row) as the sparse
        :class:`~pipeline.batching.false_negative_graph.FalseNegativeGraph` that
        :func:`~pipeline.batching.samplers.random_plan` keeps apart. None when no two rows share
        a text (the plan is then exactly the one without it).
    """
    texts = np.asarray(texts, dtype=np.int64)
    if texts.ndim != 2:
        raise ValueError(f"texts has shape {texts.shape}, expected (rows, texts per row)")
    n, k = texts.shape
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    flat = texts.reshape(-1)
    present = flat >= 0
    # One (text, row) entry per row and text, grouped by text: a row naming a text twice
    # (anchor equal to positive) belongs to its group once.
    pairs = np.unique(np.stack([flat[present], rows[present]], axis=1), axis=0)
    text, member = pairs[:, 0], pairs[:, 1]
    starts = np.flatnonzero(np.r_[True, text[1:] != text[:-1]])
    sizes = np.diff(np.r_[starts, len(text)])
    firsts, seconds = [], []
    for size in np.unique(sizes[sizes > 1]).tolist():
        group_starts = starts[sizes == size]
        members = member[group_starts[:, None] + np.arange(size)[None, :]]  # (groups, size)
        # Each member with the next min(size - 1, max_partners) members around the ring: all
        # the others when the group is small enough.
        offsets = np.arange(1, min(size, max_partners + 1))
        partners = members[:, (np.arange(size)[:, None] + offsets[None, :]) % size]
        firsts.append(np.repeat(members, len(offsets), axis=1).reshape(-1))
        seconds.append(partners.reshape(-1))
    if not firsts:
        return None
    # Each ordered pair once (two rows may share two texts). A large group's ring lists only a
    # member's next ones: the separation reads the matrix both ways.
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    edges = np.unique(np.stack([first, second], axis=1), axis=0)
    counts = np.bincount(edges[:, 0], minlength=n)
    # A row in several large groups (its anchor's and its positive's) keeps its first partners.
    slot = np.arange(len(edges)) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = slot < max_partners
    return FalseNegativeGraph.from_pairs(n, edges[keep, 0], edges[keep, 1])
