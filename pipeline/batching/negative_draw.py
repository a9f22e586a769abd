"""Each epoch's negatives drawn from a deeper mined list (``mining.sampling: random``).

With random sampling a pairs refresh keeps every acceptable negative of an anchor's rank
window, nearest first (:attr:`~pipeline.config.schema.Config.negatives_mined`). Every epoch
then trains each row with ``num_negatives`` of them, drawn anew with the epoch's seed, as
FlagEmbedding's trainer samples ``train_group_size - 1`` of ``hn_mine``'s list and tevatron
its ``train_group_size``. A pool mined once thus still varies from epoch to epoch: the
control that tells resampling apart from refreshing.
"""

from __future__ import annotations

import numpy as np

DRAW_STREAM = 7_331
"""Mixed into the epoch's seed so that the draw is not the plan's own random stream."""


def draw_negatives(
    column: np.ndarray, *, mined: int, keep: int, seed: int, teacher_scores: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row's ``keep`` negatives for one epoch, drawn among its ``mined`` ones.

    Args:
        column: ``(rows, mined + extra)`` text positions, -1 where absent: the ``mined`` mined
            negatives (nearest first), then any ``extra`` ones the refresh added beside them
            (``mining.random_negatives``), which every epoch keeps as they are.
        mined: how many leading columns were mined (the rank window's width).
        keep: how many of them each row trains with (``mining.num_negatives``), at most ``mined``.
        seed: the epoch's seed; the same seed draws the same negatives (a resumed epoch).
        teacher_scores: ``(rows, 1 + mined + extra)`` the teacher's scores of each row's
            positive and of its negatives, drawn with them; None: none.

    Returns:
        ``(negatives, teacher_scores)``: ``(rows, keep + extra)``, a uniform draw without
        replacement among each row's present mined negatives, in the order they were mined
        (nearest first), -1 where a row had fewer than ``keep``, then the extra columns; and
        the scores of the same slots, ``(rows, 1 + keep + extra)``, NaN where -1 (None
        without them). ``keep == mined`` returns both unchanged.
    """
    if not 1 <= keep <= mined <= column.shape[1]:
        raise ValueError(f"cannot draw {keep} of {mined} mined negatives from a column of {column.shape[1]}")
    if keep == mined:
        return column, teacher_scores
    order, taken = uniform_draw(column[:, :mined] >= 0, keep, np.random.default_rng([seed, DRAW_STREAM]))
    # Back in mined order (nearest first); a slot drawn from the absent ones sorts last, as -1.
    order = np.sort(np.where(taken, order, mined), axis=1)
    return take_mined(column, teacher_scores, np.minimum(order, mined - 1), order < mined, mined=mined)


def take_mined(
    column: np.ndarray, teacher_scores: np.ndarray | None, slots: np.ndarray, taken: np.ndarray, *, mined: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row's mined negatives at ``slots`` where ``taken``, then its extra columns as they are,
    with the teacher's scores of the same slots beside them: what an epoch's draw
    (:func:`draw_negatives`) and the teacher's denoising
    (:func:`~pipeline.mining.teacher_scores.denoised`) keep of a column.

    Args:
        column: ``(rows, mined + extra)`` text positions, -1 where absent.
        teacher_scores: ``(rows, 1 + mined + extra)``, the positive's first; None: none.
        slots: ``(rows, j)`` column indices below ``mined``.
        taken: ``(rows, j)`` bool, False where a slot is to be left empty.
        mined: how many leading columns were mined.

    Returns:
        ``(rows, j + extra)`` positions, -1 where not taken; and ``(rows, 1 + j + extra)``
        float32 scores, NaN where not taken (None without scores).
    """
    head = np.where(taken, np.take_along_axis(column[:, :mined], slots, axis=1), -1)
    negatives = np.concatenate([head, column[:, mined:]], axis=1)
    if teacher_scores is None:
        return negatives, None
    scored = np.where(taken, np.take_along_axis(teacher_scores[:, 1 : 1 + mined], slots, axis=1), np.nan)
    scores = np.concatenate([teacher_scores[:, :1], scored, teacher_scores[:, 1 + mined :]], axis=1)
    return negatives, scores.astype(np.float32)


def uniform_draw(alive: np.ndarray, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``m`` of each row's ``alive`` slots, uniformly without replacement.

    Args:
        alive: ``(n, k)`` bool, the slots that may be drawn.
        m: slots drawn a row (a row with fewer alive gives them all).
        rng: the random source; one ``(n, k)`` draw of it.

    Returns:
        ``(order, taken)``, both ``(n, m)`` (fewer columns when ``k < m``): the drawn slots'
        column indices, and whether each is alive (False where a row ran out).
    """
    # Random keys for alive slots, +inf for the rest: the m smallest are a uniform draw.
    keys = np.where(alive, rng.random(alive.shape), np.inf)
    order = np.argsort(keys, axis=1, kind="stable")[:, :m]
    return order, np.take_along_axis(alive, order, axis=1)
