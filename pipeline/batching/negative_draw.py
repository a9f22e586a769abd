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


def draw_negatives(column: np.ndarray, *, mined: int, keep: int, seed: int) -> np.ndarray:
    """Each row's ``keep`` negatives for one epoch, drawn among its ``mined`` ones.

    Args:
        column: ``(rows, mined + extra)`` text positions, -1 where absent: the ``mined`` mined
            negatives (nearest first), then any ``extra`` ones the refresh added beside them
            (``mining.random_negatives``), which every epoch keeps as they are.
        mined: how many leading columns were mined (the rank window's width).
        keep: how many of them each row trains with (``mining.num_negatives``), at most ``mined``.
        seed: the epoch's seed; the same seed draws the same negatives (a resumed epoch).

    Returns:
        ``(rows, keep + extra)``: a uniform draw without replacement among each row's present
        mined negatives, in the order they were mined (nearest first), -1 where a row had
        fewer than ``keep``; then the extra columns. ``keep == mined`` returns the column
        unchanged.
    """
    if not 1 <= keep <= mined <= column.shape[1]:
        raise ValueError(f"cannot draw {keep} of {mined} mined negatives from a column of {column.shape[1]}")
    if keep == mined:
        return column
    head = column[:, :mined]
    rng = np.random.default_rng([seed, DRAW_STREAM])
    # The `keep` smallest random keys among the present ones are a uniform draw; sorting the
    # chosen column indices puts them back in mined order.
    keys = np.where(head >= 0, rng.random(head.shape), np.inf)
    chosen = np.sort(np.argpartition(keys, keep - 1, axis=1)[:, :keep], axis=1)
    drawn = np.take_along_axis(head, chosen, axis=1)
    # A row with fewer than `keep` present keeps them all: argpartition may have picked absent
    # slots (+inf keys), which sort after the present ones only by key, not by index.
    present = np.take_along_axis(keys, chosen, axis=1) < np.inf
    drawn = np.where(present, drawn, -1)
    drawn = np.take_along_axis(drawn, np.argsort(~present, axis=1, kind="stable"), axis=1)
    return np.concatenate([drawn, column[:, mined:]], axis=1)
