"""What one refresh hands back to training (:class:`RefreshReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.batching.plan import BatchPlan


@dataclass
class RefreshReport:
    """What one mining hands back to training: the corpus task's next order of rows (``plan``)
    or the pairs task's new negatives column (``negatives``, one row per training row), and
    what the mining measured (``metrics``, already logged by the miner). A miner given run
    storage (``MinerSettings.mined_dir``) writes the plan or column there and hands back its
    URI (``mined``) instead: no train worker receives every row."""

    version: int
    metrics: dict[str, float]
    plan: BatchPlan | None = None
    negatives: np.ndarray | None = None
    """``(rows, m)`` text positions of each training row's negatives, -1 where none (int32 up to
    2^31 texts: :func:`~pipeline.core.positions.position_dtype`)."""
    teacher_scores: np.ndarray | None = None
    """Beside ``negatives`` where a teacher scored them: ``(rows, 1 + m)`` float32, its score of
    each row's positive, then of each negative (NaN where none)."""
    mined: str | None = None
    """URI of the plan or negatives column written to run storage; None: they are above."""
    miner_pid: int | None = None
    """The process id of the miner that mined it: a new one tells rank 0 that Ray restarted the
    miner since the last refresh (it died between refreshes, e.g. with its node)."""
    similarities: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """The histogram the refresh logs: ``label -> cosine similarities``, the random baseline
    first; empty: none drawn."""
    teacher_histogram: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """The teacher's scores the refresh draws apart (``label -> scores``: the positives', the
    negatives kept and dropped); empty: no teacher."""
