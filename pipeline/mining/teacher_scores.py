"""The teacher in a pairs refresh: its scores of each row's positive and mined negatives, as a
column beside the negatives (:func:`teacher_scores`), and the negatives it calls positives
dropped (:func:`denoised`, RocketQA's denoising of mined negatives).

The column is ``(rows, 1 + m)`` float32: the teacher's score of the row's anchor with its
positive, then with each of its ``m`` negatives (NaN where a row has none in that slot). It
travels with the negatives to the ranks (the distillation term of
:class:`~pipeline.training.triplet_step.TripletStep`) and into ``jobs/mine.py``'s output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from pipeline.batching.negative_draw import take_mined

TextsAt = Callable[[np.ndarray], list[str]]
"""The texts at corpus positions (:meth:`~pipeline.data.text_blocks.DistinctTexts.texts_at`)."""


class PairScorer(Protocol):
    """A teacher as a refresh asks it: one loaded here (:class:`~pipeline.model.teacher.Teacher`),
    or the miner's shards, each scoring a part with its own
    (:meth:`~pipeline.mining.miner_shards.MinerShards.score_indexed`)."""

    def score_indexed(self, texts: list[str], left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(len(left),)`` float32: the score of each pair ``(texts[left[i]], texts[right[i]])``."""
        ...

    def computed(self) -> tuple[int, str]:
        """What it has computed so far, and of what: a bi-encoder's texts encoded (``"texts"``),
        a cross-encoder's pairs scored (``"pairs"``); what its cache answered is not counted."""
        ...


def teacher_scores(
    teacher: PairScorer,
    texts_at: TextsAt,
    *,
    anchors: np.ndarray,
    positives: np.ndarray,
    negatives: np.ndarray,
) -> tuple[np.ndarray, int]:
    """The teacher's score of every (anchor, candidate) pair of the rows.

    Args:
        teacher: a :class:`PairScorer` (in the miner, its shards: each scores a part).
        texts_at: the texts at corpus positions.
        anchors, positives: ``(rows,)`` corpus positions.
        negatives: ``(rows, m)`` corpus positions, -1 where absent.

    Returns:
        ``(scores, pairs)``: ``(rows, 1 + m)`` float32, column 0 the positive's score, then each
        negative's, NaN where the negative is absent; and how many distinct pairs the teacher
        scored. A pair that occurs in several rows is scored once, and each distinct text is
        read once.
    """
    candidates = _candidates(positives, negatives)
    out = np.full(candidates.shape, np.nan, dtype=np.float32)
    pairs = _score_cells(
        teacher, texts_at, anchors=anchors, candidates=candidates, asked=candidates >= 0, into=out
    )
    return out, pairs


def _candidates(positives: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """``(rows, 1 + m)`` int64: each row's positive, then its negatives."""
    return np.concatenate([positives[:, None], negatives], axis=1).astype(np.int64)


def _score_cells(
    teacher: PairScorer,
    texts_at: TextsAt,
    *,
    anchors: np.ndarray,
    candidates: np.ndarray,
    asked: np.ndarray,
    into: np.ndarray,
) -> int:
    """Write the teacher's score of the pairs (``anchors[i]``, ``candidates[i, j]``) where
    ``asked`` into ``into``; each distinct pair scored once, each distinct text read once.
    Returns how many pairs the teacher scored."""
    if not asked.any():
        return 0
    left = np.broadcast_to(anchors[:, None], candidates.shape)[asked].astype(np.int64)
    right = candidates[asked]
    base = int(max(left.max(initial=0), right.max(initial=0))) + 1
    pairs, at = np.unique(left * base + right, return_inverse=True)
    positions, index = np.unique(np.concatenate([pairs // base, pairs % base]), return_inverse=True)
    scored = teacher.score_indexed(texts_at(positions), index[: len(pairs)], index[len(pairs) :])
    into[asked] = scored[at.reshape(-1)]
    return len(pairs)


def denoised_in_steps(
    teacher: PairScorer,
    texts_at: TextsAt,
    *,
    anchors: np.ndarray,
    positives: np.ndarray,
    negatives: np.ndarray,
    margin: float,
    mined: int,
    keep: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """:func:`teacher_scores` then :func:`denoised`, scoring no deeper than each row needs.

    The teacher first scores each row's positive, its extra (random) negatives and its first
    ``keep`` mined ones; a row with fewer than ``keep`` survivors then has its next mined
    negatives scored, as many as it lacks, until it has ``keep`` or its window is spent. The
    negatives kept and their scores equal those of scoring the whole window first; a window
    scored to its end costs as much as before, but a teacher that drops few scores far fewer
    pairs: on the Twitter URL recipe (k = 1, 64-deep windows) 12,140 distinct pairs instead of
    417,556: with bf16, 186 s where the whole window in fp32 took 1,108 s (docs/results.md).

    Returns:
        :func:`denoised`'s ``(negatives, scores, dropped)``, and the pairs the teacher scored.
    """
    candidates = _candidates(positives, negatives)
    present = candidates >= 0
    scores = np.full(candidates.shape, np.nan, dtype=np.float32)
    asked = present.copy()
    asked[:, 1 : 1 + mined] = False  # the positive and the extras, then each step's band below
    window = np.arange(mined)[None, :]
    scored_to = np.zeros(len(candidates), dtype=np.int64)  # mined columns asked so far, per row
    lacking = np.full(len(candidates), keep)
    pairs = 0
    while True:  # at least once: the positive and the extras are scored whatever ``keep`` is
        band = (window >= scored_to[:, None]) & (window < (scored_to + lacking)[:, None])
        asked[:, 1 : 1 + mined] = band & present[:, 1 : 1 + mined]
        scored_to = np.minimum(scored_to + lacking, mined)
        pairs += _score_cells(
            teacher, texts_at, anchors=anchors, candidates=candidates, asked=asked, into=scores
        )
        asked[:] = False
        survivors = _survivors(scores, margin=margin, mined=mined)[0].sum(axis=1)
        lacking = np.where(scored_to < mined, np.maximum(keep - survivors, 0), 0)
        if not lacking.any():
            break
    kept, kept_scores, dropped = denoised(negatives, scores, margin=margin, mined=mined, keep=keep)
    return kept, kept_scores, dropped, pairs


def denoised(
    negatives: np.ndarray, scores: np.ndarray, *, margin: float, mined: int, keep: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Drop the mined negatives the teacher scores at or above its positive less ``margin``.

    Args:
        negatives: ``(rows, mined + extra)`` corpus positions, -1 where absent: ``mined``
            mined ones, nearest first, then any extra (random) ones, which are kept as they are.
        scores: ``(rows, 1 + mined + extra)`` :func:`teacher_scores` of them; a mined negative
            left unscored (NaN) is not kept.
        margin: a negative within this of the positive's teacher score is a likely positive.
        mined: how many leading columns were mined.
        keep: mined negatives kept a row after the drop (the nearest survivors), at most ``mined``.

    Returns:
        ``(negatives, scores, dropped)``: ``(rows, keep + extra)`` and ``(rows, 1 + keep +
        extra)``, each row's surviving mined negatives moved to the front in their order, -1
        and NaN behind them; and the teacher's scores of the negatives dropped.
    """
    alive, dropped = _survivors(scores, margin=margin, mined=mined)
    # A stable sort of "not alive" moves the survivors to the front in their mined order.
    order = np.argsort(~alive, axis=1, kind="stable")[:, :keep]
    kept, kept_scores = take_mined(
        negatives, scores, order, np.take_along_axis(alive, order, axis=1), mined=mined
    )
    assert kept_scores is not None
    return kept, kept_scores, scores[:, 1 : 1 + mined][dropped]


def _survivors(scores: np.ndarray, *, margin: float, mined: int) -> tuple[np.ndarray, np.ndarray]:
    """``(alive, dropped)``, ``(rows, mined)`` bool: the scored mined negatives below the
    positive's score less ``margin``, and those at or above it. An absent or unscored one
    (NaN, :func:`denoised_in_steps`) is neither."""
    head = scores[:, 1 : 1 + mined]
    scored = ~np.isnan(head)
    dropped = scored & (head >= scores[:, :1] - margin)
    return scored & ~dropped, dropped


def scored_by_teacher(
    teacher: PairScorer,
    texts_at: TextsAt,
    *,
    anchors: np.ndarray,
    positives: np.ndarray,
    negatives: np.ndarray,
    denoise_margin: float | None,
    mined: int,
    keep: int,
    version: int,
) -> tuple[np.ndarray, np.ndarray, dict[str, float], dict[str, np.ndarray]]:
    """A refresh's teacher step: :func:`teacher_scores` of the rows' negatives or, with a
    ``denoise_margin``, :func:`denoised_in_steps`, keeping ``keep`` of the ``mined`` leading
    columns.

    Returns:
        ``(negatives, scores, metrics, histogram)``: the column (denoised), the teacher's scores
        beside it, the refresh table's ``mining/teacher_*`` rows (:func:`teacher_summary`, the
        drops, the seconds), and the teacher's scores of the positives, of the negatives kept and
        of those dropped (``label: scores``), where a user sees the margin cut. One line says
        what it did.
    """
    started = time.perf_counter()
    computed_before, _ = teacher.computed()
    if denoise_margin is None:
        scores, pairs = teacher_scores(
            teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives
        )
        dropped = np.empty(0, dtype=np.float32)
    else:
        negatives, scores, dropped, pairs = denoised_in_steps(
            teacher, texts_at, anchors=anchors, positives=positives, negatives=negatives,
            margin=denoise_margin, mined=mined, keep=keep,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    computed, unit = teacher.computed()
    computed -= computed_before
    said = f", {len(dropped)} negatives dropped as likely positives" if denoise_margin is not None else ""
    print(
        f"[mining] v{version}: the teacher scored {pairs:,} distinct pairs in {seconds:.1f}s "
        f"({computed:,} {unit} computed, the rest from its cache){said}",
        flush=True,
    )
    metrics = {
        **teacher_summary(scores),
        "mining/teacher_pairs": float(pairs),
        "mining/teacher_computed": float(computed),
        "mining/teacher_denoised": float(len(dropped)),
        "mining/teacher_s": seconds,
    }
    histogram = {
        "positives": scores[:, 0],
        "negatives kept": scores[:, 1:][~np.isnan(scores[:, 1:])],
        "negatives dropped as likely positives": dropped,
    }
    return negatives, scores, metrics, {label: s for label, s in histogram.items() if len(s)}


def teacher_summary(scores: np.ndarray) -> dict[str, float]:
    """What a run charts of the teacher's ``(rows, 1 + m)`` scores: its mean score of the
    positives and of the negatives, and the median of each row's margin (positive less its
    highest-scored negative; rows without a negative left out)."""
    negatives = scores[:, 1:]
    present = ~np.isnan(negatives)
    with_negative = present.any(axis=1)
    hardest = np.where(present, negatives, -np.inf).max(axis=1, initial=-np.inf)
    margins = (scores[:, 0] - hardest)[with_negative]
    return {
        "mining/teacher_positive_score": float(scores[:, 0].mean()),
        "mining/teacher_negative_score": float(negatives[present].mean()) if present.any() else float("nan"),
        "mining/teacher_margin_p50": float(np.median(margins)) if len(margins) else float("nan"),
    }
