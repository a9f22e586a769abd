"""Hard-negative selection with false-negative control, over k-NN candidate lists.

The knobs carry sentence-transformers' ``mine_hard_negatives`` names so that users can
move settings over: ``range_min`` / ``range_max`` (rank window), ``max_score``
(similarity ceiling), ``relative_margin`` (NV-Retriever's TopK-PercPos: keep a candidate
only if its similarity is at most ``pos - |pos| x margin``, ``pos`` being the
anchor-positive similarity), ``num_negatives`` and ``sampling``, with its semantics too:
duplicates of the anchor or positive go first, then ``max_score`` and the margin, and
``range_min`` skips the nearest of the candidates that are left (``range_max`` bounds the
rank in the search list). The pairs task adds one filter before the scores are looked at: a
candidate that is a *known positive* of the anchor (any row's positive of the same anchor text,
not only the row's own) is no negative, whatever its score. Each filter's removals are
counted, so a run can say where its candidates went.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.batching.negative_draw import uniform_draw
from pipeline.config.schema import Config

FILTERS = ("duplicate", "known_positive", "max_score", "relative_margin", "rank_window")


@dataclass
class NegativeFilters:
    """What makes a neighbour an acceptable negative (see module docstring)."""

    range_min: int = 10
    """Skip this many of the nearest candidates that pass the other filters."""
    range_max: int | None = None
    """Consider only candidates ranked below this among the non-duplicates searched
    (``None``: all searched)."""
    max_score: float | None = None
    """Drop candidates more similar than this to the anchor."""
    relative_margin: float | None = 0.05
    """Drop candidates with similarity > ``pos - |pos| x margin``, ``pos`` = sim(anchor, positive)."""
    num_negatives: int = 1
    sampling: str = "top"
    """``top``: the nearest that pass; ``random``: a seeded uniform draw among those that pass."""

    @classmethod
    def from_config(cls, cfg: Config) -> NegativeFilters:
        """The config's filters (``range_min`` as resolved for the task)."""
        mining = cfg.mining
        return cls(
            range_min=cfg.range_min,
            range_max=mining.range_max,
            max_score=mining.max_score,
            relative_margin=mining.relative_margin,
            num_negatives=mining.num_negatives,
            sampling=mining.sampling,
        )


@dataclass
class SelectedNegatives:
    indices: np.ndarray
    """``(n, num_negatives)`` candidate positions, -1 where an anchor has too few."""
    scores: np.ndarray
    """``(n, num_negatives)`` anchor-negative similarity, NaN where missing."""
    per_row: dict[str, np.ndarray] = field(default_factory=dict)
    """Per anchor, ``(n,)`` int32 each: its ``candidates`` (valid k-NN entries), those ``kept``
    by every filter before sampling, and ``removed_<filter>`` for every filter in
    :data:`FILTERS` (a run's totals: :func:`~pipeline.mining.mining_metrics.mining_metrics`)."""


@dataclass
class FilteredCandidates:
    allowed: np.ndarray
    """``(n, k)`` bool: the candidate passed every filter."""
    false_negative: np.ndarray
    """``(n, k)`` bool: removed as a likely false negative (a duplicate, ranked above
    ``range_min``, above ``max_score`` or inside the relative margin). Candidates ranked at
    or past ``range_max`` are not false negatives, only too far."""
    duplicate: np.ndarray
    """``(n, k)`` bool: the duplicate mask the filters were given."""
    removed: dict[str, np.ndarray]
    """``(n,)`` int32 a filter of :data:`FILTERS`: the candidates it removed, per anchor (a
    run's totals are their sums)."""


def filter_candidates(
    candidates: np.ndarray,
    candidate_scores: np.ndarray,
    positive_scores: np.ndarray,
    *,
    duplicate: np.ndarray,
    filters: NegativeFilters,
    known_positive: np.ndarray | None = None,
) -> FilteredCandidates:
    """Apply the filters in order and count what each removes (arguments as in
    :func:`select_negatives`)."""
    k = candidates.shape[1]
    valid = candidates >= 0
    alive = valid.copy()
    false_negative = np.zeros_like(valid)
    per_row = {name: np.zeros(len(candidates), dtype=np.int32) for name in FILTERS}

    def drop(name: str, mask: np.ndarray, is_false_negative: bool = True) -> None:
        nonlocal alive, false_negative
        hit = alive & mask
        per_row[name] += hit.sum(axis=1, dtype=np.int32)
        alive = alive & ~hit
        if is_false_negative:
            false_negative = false_negative | hit

    drop("duplicate", duplicate)
    if known_positive is not None:
        drop("known_positive", known_positive)
    # range_max bounds the rank in the searched list (duplicates not counted): sentence-
    # transformers' search depth.
    searched_rank = np.cumsum(alive, axis=1) - 1
    if filters.max_score is not None:
        drop("max_score", candidate_scores > filters.max_score)
    if filters.relative_margin is not None:
        # |pos| rather than (1 - margin) x pos: the latter raises the bar above the positive
        # when pos < 0 (sentence-transformers #3819).
        threshold = positive_scores - np.abs(positive_scores) * filters.relative_margin
        drop("relative_margin", candidate_scores > threshold[:, None])
    upper = k if filters.range_max is None else filters.range_max
    drop("rank_window", searched_rank >= upper, is_false_negative=False)
    # range_min skips the nearest of what is left, as sentence-transformers counts it.
    drop("rank_window", np.cumsum(alive, axis=1) - 1 < filters.range_min)
    return FilteredCandidates(alive, false_negative, duplicate, per_row)


def select_negatives(
    candidates: np.ndarray,
    candidate_scores: np.ndarray,
    positive_scores: np.ndarray,
    *,
    duplicate: np.ndarray,
    filters: NegativeFilters,
    seed: int | list[int] = 0,
    known_positive: np.ndarray | None = None,
) -> SelectedNegatives:
    """Apply the filters to each anchor's candidate list and pick its negatives.

    Args:
        candidates: ``(n, k)`` candidate positions per anchor, most similar first; -1 for
            an empty slot.
        candidate_scores: ``(n, k)`` similarity of each candidate to its anchor.
        positive_scores: ``(n,)`` similarity of each anchor to its positive (for the
            relative margin). In unsupervised use the positive is the anchor itself: 1.0.
        duplicate: ``(n, k)`` bool, True where the candidate is the anchor, the positive, or
            the same text as either (exactly or after :func:`~pipeline.mining.text_keys.normalize_text`).
        filters: the settings.
        seed: for ``sampling="random"`` (an int, or a list: numpy's seed sequence).
        known_positive: optional ``(n, k)`` bool, True where the candidate is a known positive
            of the anchor (:class:`~pipeline.mining.text_keys.KnownPositives`); removed
            before any score filter.

    Returns:
        The chosen negatives and, per anchor, how many candidates each filter removed.
    """
    if filters.sampling not in ("top", "random"):
        raise ValueError(f"mining.sampling must be top or random (got {filters.sampling!r})")
    n, k = candidates.shape
    filtered = filter_candidates(
        candidates,
        candidate_scores,
        positive_scores,
        duplicate=duplicate,
        filters=filters,
        known_positive=known_positive,
    )
    alive = filtered.allowed
    m = filters.num_negatives
    if filters.sampling == "random":
        order, taken = uniform_draw(alive, m, np.random.default_rng(seed))
    else:
        keys = np.where(alive, np.arange(k)[None, :], np.inf)  # list order = similarity order
        order = np.argsort(keys, axis=1, kind="stable")[:, :m]
        taken = np.take_along_axis(alive, order, axis=1)
    indices = np.where(taken, np.take_along_axis(candidates, order, axis=1), -1)
    scores = np.where(taken, np.take_along_axis(candidate_scores, order, axis=1), np.nan)
    if filters.sampling == "random":
        # Present each anchor's draw nearest first, like the top strategy.
        by_score = np.argsort(np.where(taken, -scores, np.inf), axis=1, kind="stable")
        indices = np.take_along_axis(indices, by_score, axis=1)
        scores = np.take_along_axis(scores, by_score, axis=1)
    if indices.shape[1] < m:  # fewer candidates searched than negatives asked for
        pad = m - indices.shape[1]
        indices = np.pad(indices, ((0, 0), (0, pad)), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=np.nan)
    per_row = {
        "candidates": (candidates >= 0).sum(axis=1, dtype=np.int32),
        "kept": alive.sum(axis=1, dtype=np.int32),
        **{f"removed_{name}": counts for name, counts in filtered.removed.items()},
    }
    return SelectedNegatives(indices, scores, per_row=per_row)
