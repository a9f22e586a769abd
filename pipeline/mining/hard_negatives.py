"""Each anchor's negatives among its searched candidates (:func:`negatives_among`), wherever
the search ran: the miner's shards search where the texts are held and hand back top lists
(:class:`Searched`).

After the search, mining is three steps, each visible in the function body: mark the
candidates that are the anchor's own text or one of its known positives, filter them
(:mod:`pipeline.mining.negatives`), and keep ``num_negatives`` per anchor. The result is data,
not a control object: a :class:`MinedNegatives` table with one row per anchor. What a run logs
of a mining is computed from that table afterwards, in one place
(:func:`pipeline.mining.mining_metrics.mining_metrics`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.config.schema import Config
from pipeline.core.positions import position_dtype
from pipeline.mining.index import IndexSpec, choose_backend, index_memory_budget
from pipeline.mining.negatives import NegativeFilters, select_negatives
from pipeline.mining.text_keys import KnownPositives, duplicate_mask


@dataclass(frozen=True)
class SearchSettings:
    """How the nearest neighbours are searched: ``mining.top_k``, the index and the device."""

    top_k: int = 64
    index: IndexSpec = field(default_factory=IndexSpec)
    use_gpu: bool = False

    @classmethod
    def from_config(cls, cfg: Config) -> SearchSettings:
        mining = cfg.mining
        return cls(top_k=mining.top_k, index=IndexSpec(mining.index), use_gpu=mining.num_gpus > 0)

    def index_kind(self, n: int, dim: int = 0) -> str:
        """The index kind a search over ``n`` vectors of ``dim`` builds on this device, checked
        against the memory free there when ``dim`` is given (:meth:`IndexSpec.resolve`: IVF-PQ
        where ``auto``'s choice would not fit; one line, before anything is built, where none
        fits)."""
        backend = choose_backend(self.use_gpu)
        budget = index_memory_budget(backend) if dim else None
        return self.index.resolve(n, backend, dim=dim, budget=budget)


@dataclass(frozen=True)
class MinedNegatives:
    """What one mining found, one row per anchor, in the order the anchors were given.

    ``table`` columns: ``negatives`` (``num_negatives`` pool positions, -1 where the filters
    left too few), ``scores`` (their cosine similarity to the anchor, NaN where missing),
    ``positive_score`` (anchor-positive cosine), ``candidates`` (neighbours searched),
    ``kept`` (candidates that passed every filter) and ``removed_<filter>`` for each filter of
    :data:`~pipeline.mining.negatives.FILTERS`, in the order they apply. :attr:`negatives` and
    :attr:`scores` read the first two as ``(anchors, num_negatives)`` arrays, as callers index
    them (views of the table's buffers, not copies).
    """

    table: pa.Table
    backend: str
    """The search backend that ran (``faiss-cpu``, ``faiss-gpu``, ``torch-cuda``)."""
    seconds: dict[str, float]
    """``index``, ``search`` and ``filter`` wall time."""

    @property
    def negatives(self) -> np.ndarray:
        """``(anchors, num_negatives)`` pool positions (int32 up to 2^31 pool texts:
        :func:`~pipeline.core.positions.position_dtype`), -1 where missing."""
        return _matrix(self.table.column("negatives"))

    @property
    def scores(self) -> np.ndarray:
        """``(anchors, num_negatives)`` float32 cosine similarities, NaN where missing."""
        return _matrix(self.table.column("scores"))

    @classmethod
    def concat(cls, parts: list[MinedNegatives]) -> MinedNegatives:
        """The minings of consecutive chunks of anchors over one index, as one: their rows in
        order, the index's build time once, the search and filter times summed."""
        seconds = {
            "index": parts[0].seconds["index"],
            "search": sum(p.seconds["search"] for p in parts),
            "filter": sum(p.seconds["filter"] for p in parts),
        }
        return cls(pa.concat_tables([p.table for p in parts]).combine_chunks(), parts[0].backend, seconds)


def _matrix(column: pa.ChunkedArray) -> np.ndarray:
    """A fixed-size-list column as a ``(rows, list size)`` array."""
    lists = column.combine_chunks()
    return lists.flatten().to_numpy().reshape(len(lists), lists.type.list_size)


@dataclass(frozen=True)
class Searched:
    """Each anchor's nearest pool candidates, as a search returned them."""

    scores: np.ndarray
    """``(n, top_k)`` cosine similarities, best first."""
    candidates: np.ndarray
    """``(n, top_k)`` pool positions (-1: none)."""
    seconds: float
    backend: str
    """The search backend that ran."""
    index_seconds: float
    """What building the index took."""


def negatives_among(
    searched: Searched,
    *,
    positive_scores: np.ndarray,
    anchor_keys: np.ndarray,
    positive_keys: np.ndarray,
    pool_keys: np.ndarray,
    filters: NegativeFilters,
    seed: int | list[int],
    known_positives: KnownPositives | None,
) -> MinedNegatives:
    """Mark the candidates that are the anchor's own text or a known positive, filter them,
    keep ``filters.num_negatives`` an anchor.

    Args:
        searched: the anchors' nearest candidates among the pool.
        positive_scores: ``(n,)`` each anchor's cosine with its positive.
        anchor_keys, positive_keys, pool_keys: ``(n,)``, ``(n,)``, ``(p,)``
            :func:`~pipeline.mining.text_keys.dense_keys` of the anchors, positives and pool, in
            one key space: equal keys are the same sentence
            (:func:`~pipeline.data.normalize.normalize_text`).
        filters: which candidates are acceptable negatives and how many to keep.
        seed: ``sampling: random`` (a list: numpy's seed sequence, for one chunk of a mining).
        known_positives: every row's (anchor, positive) pair, these anchors being one chunk of
            the rows: a candidate that is the positive of *any* row with the same anchor text
            is removed (retrieval pairs: several positives per anchor, texts that are the
            positive of several anchors), not only the row's own positive; None: only the
            row's own.

    Returns:
        One row per anchor: its negatives as pool positions, their scores, and what each
        filter removed (:class:`MinedNegatives`).
    """
    candidate_scores, candidates = searched.scores, searched.candidates
    t0 = time.perf_counter()
    duplicate = duplicate_mask(candidates, anchor_keys, positive_keys, pool_keys)
    known = known_positives.mask(candidates, anchor_keys, pool_keys) if known_positives is not None else None
    positive_scores = np.asarray(positive_scores, dtype=np.float32)
    chosen = select_negatives(
        candidates,
        candidate_scores,
        positive_scores,
        duplicate=duplicate,
        filters=filters,
        seed=seed,
        known_positive=known,
    )
    m = chosen.indices.shape[1]
    table = pa.table(
        {
            "negatives": pa.FixedSizeListArray.from_arrays(
                pa.array(chosen.indices.ravel().astype(position_dtype(len(pool_keys)))), m
            ),
            "scores": pa.FixedSizeListArray.from_arrays(
                pa.array(chosen.scores.ravel().astype(np.float32), pa.float32()), m
            ),
            "positive_score": positive_scores,
            **chosen.per_row,
        }
    )
    seconds = {
        "index": searched.index_seconds,
        "search": searched.seconds,
        "filter": time.perf_counter() - t0,
    }
    return MinedNegatives(table, searched.backend, seconds)
