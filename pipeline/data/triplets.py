"""Supervised rows as positions into one de-duplicated table of texts (:class:`Triplets`), so
each text is tokenized and encoded once however often it occurs.

No reading here: the train step, the miner and the tokenized corpus import this without the
Ray Data readers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.data.utf8 import stable_row_id


@dataclass
class Triplets:
    """Supervised rows as positions into one de-duplicated text corpus."""

    anchor: np.ndarray
    positive: np.ndarray
    negative: np.ndarray
    """Given negative per row, -1 where none."""
    pool: np.ndarray | None = None
    """Positions of the candidate texts mining searches (``data.pool``: a separate corpus whose
    texts were added to the table, with the distinct positives, as sentence-transformers'
    ``mine_hard_negatives(corpus=...)`` adds them); None: the distinct positives."""

    def __len__(self) -> int:
        return len(self.anchor)

    def candidate_pool(self) -> np.ndarray:
        """Sorted, distinct positions of the texts negatives are mined from."""
        return np.unique(self.pool if self.pool is not None else self.positive)


def index_triplets(
    anchors: list[str],
    positives: list[str],
    negatives: list[str] | None,
    pool: list[str] | None = None,
) -> tuple[pa.Table, Triplets]:
    """One ``(id, text)`` table of every distinct text, sorted by id, and the rows as positions
    in it: each text is tokenized and encoded once however often it occurs.

    ``pool``: candidate texts for mining (``data.pool``); they join the table, and
    ``Triplets.pool`` holds their positions and the distinct positives'.
    """
    texts = set(anchors) | set(positives) | ({t for t in negatives if t} if negatives else set())
    texts |= set(pool or ())
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    text_list = list(texts)
    order = np.argsort(ids)
    table = pa.table({"id": ids[order], "text": [text_list[i] for i in order]})
    position = {text_list[i]: rank for rank, i in enumerate(order.tolist())}
    negative = (
        np.array([position[t] if t else -1 for t in negatives], dtype=np.int64)
        if negatives is not None
        else np.full(len(anchors), -1, dtype=np.int64)
    )
    positive = np.array([position[t] for t in positives], dtype=np.int64)
    triplets = Triplets(
        np.array([position[t] for t in anchors], dtype=np.int64),
        positive,
        negative,
        pool=(
            np.union1d(np.array([position[t] for t in pool], dtype=np.int64), positive)
            if pool is not None
            else None
        ),
    )
    return table, triplets
