"""The offline job's mining, without Ray or MLflow: (anchor, positive) pairs and a model in,
the output table (anchor, positive, negative_1..n) and a :class:`MiningReport` out.

The candidate pool is every distinct positive and the texts of ``data.pool``: with the same
config and model, the negatives are those the training job mines before epoch 1, because both
call :func:`pipeline.mining.hard_negatives.mine_hard_negatives` and describe the result with
:func:`~pipeline.mining.mining_metrics.mining_metrics`. Anchors left with fewer than
``mining.num_negatives`` negatives are dropped from the output and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.config.schema import Config
from pipeline.mining.hard_negatives import SearchSettings, mine_hard_negatives
from pipeline.mining.index import estimate_index_bytes, index_summary
from pipeline.mining.mining_metrics import mining_metrics, random_pair_similarities
from pipeline.mining.negatives import FILTERS, NegativeFilters
from pipeline.mining.text_keys import text_keys
from pipeline.model.accel import compute_device, mining_dtype
from pipeline.model.encode import encode_batch_size, encode_texts
from pipeline.tracking.run import ui_command


@dataclass
class MiningReport:
    """What one offline mining run read, kept and wrote: the console summary and the MLflow
    run's ``mining/`` metrics.

    ``mined``: :func:`~pipeline.mining.mining_metrics.mining_metrics` of the mining, the same
    numbers a training refresh logs. Counts of the job's own: ``rows_in`` (anchor, positive)
    rows read, ``rows_out`` written (those with every negative), ``pairs_dropped_empty`` (an
    empty anchor or positive).
    """

    rows_in: int = 0
    rows_out: int = 0
    pairs_dropped_empty: int = 0
    negatives_per_row: int = 0
    backend: str = ""
    encode_device: str = ""
    """``cpu`` or ``cuda``: where the texts were encoded."""
    encode_dtype: str = ""
    """``fp32`` or ``bf16``: in what (:func:`~pipeline.model.accel.mining_dtype`)."""
    mined: dict[str, float] = field(default_factory=dict)
    similarities: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Cosine similarities for the review histogram: ``positives`` (anchor-positive),
    ``negatives`` (anchor-mined negative, written rows) and ``random pairs`` (anchor-random pool row)."""
    run_id: str = ""
    experiment: str = ""
    tracking_uri: str = ""

    def count(self, name: str) -> int:
        """One of :attr:`mined`'s counts (``candidates``, ``removed_duplicate``, ...)."""
        return int(self.mined.get(f"mining/{name}", 0))

    def render(self, output: str) -> str:
        removed = ", ".join(f"{name} {self.count(f'removed_{name}')}" for name in FILTERS)
        timing = ", ".join(
            f"{stage} {self.mined[f'mining/{stage}_s']:.1f}s"
            for stage in ("encode", "index", "search", "filter")
            if f"mining/{stage}_s" in self.mined
        )
        lines = [
            f"mined {output}",
            f"  rows          {self.rows_out} written of {self.rows_in} pairs ({self.pairs_dropped_empty} empty dropped)",
            f"  negatives     {self.negatives_per_row} per row, from {self.count('corpus_size')} candidates ({self.backend})",
            f"  candidates    {self.count('candidates')} looked at; removed: {removed}; {self.count('kept')} passed",
            f"  too few       {self.count('anchors_short')} anchors had fewer than {self.negatives_per_row} negatives (dropped)",
        ]
        if "mining/negative_similarity_mean" in self.mined:
            sims = {s: self.mined[f"mining/negative_similarity_{s}"] for s in ("mean", "p10", "p50", "p90")}
            lines.append(
                f"  similarity    negatives mean {sims['mean']:.3f} (p10 {sims['p10']:.3f}, p50 {sims['p50']:.3f}, "
                f"p90 {sims['p90']:.3f}); positives mean {self.mined['mining/positive_similarity_mean']:.3f}"
            )
        lines.append(f"  time          {timing} (encoded on {self.encode_device} in {self.encode_dtype})")
        if self.run_id:
            lines += [
                f"  mlflow run    {self.run_id} (experiment {self.experiment!r})",
                f"  review with   {ui_command(self.tracking_uri)}",
            ]
        return "\n".join(lines)

    def metrics(self) -> dict[str, float]:
        """The report as MLflow metrics (the ``mining/`` chart section)."""
        return {
            **self.mined,
            "mining/rows_in": float(self.rows_in),
            "mining/rows_out": float(self.rows_out),
        }


def mine_pairs(
    anchors: list[str],
    positives: list[str],
    model: Any,
    tokenizer: Any,
    cfg: Config,
    device: torch.device | None = None,
    echo: Any = None,
    pool_texts: list[str] | None = None,
) -> tuple[pa.Table, MiningReport]:
    """Mine negatives for each (anchor, positive) among the candidate pool: the distinct
    positives and ``pool_texts`` (``data.pool``), as the training miner's pool. Every positive
    any row gives an anchor's text is excluded from its candidates, as the training miner does.
    Encodes on ``device``, by default where the training miner would with this config
    (:func:`~pipeline.model.accel.compute_device` of ``mining.num_gpus > 0``, here in this
    process), and moves ``model`` there.

    Returns the output table (``anchor``, ``positive``, ``negative_1``..``negative_n``) and
    the report of what each filter removed.
    """
    mining = cfg.mining
    device = device or compute_device(use_gpu=mining.num_gpus > 0)
    model.to(device)
    report = MiningReport(rows_in=len(anchors), negatives_per_row=mining.num_negatives)
    report.encode_device, report.encode_dtype = device.type, mining_dtype(device)
    pool = sorted(set(positives).union(pool_texts or ()))
    t0 = time.perf_counter()

    def encode(texts: list[str]) -> np.ndarray:
        return encode_texts(model, tokenizer, texts, cfg.data.max_seq_len, encode_batch_size(device), device)

    # Each distinct text is encoded once: anchors repeat (SNLI premises) or are positives too.
    # The pool comes first, so pool position i is text position i.
    texts = pool + sorted(set(anchors).union(positives).difference(pool))
    vectors = encode(pool)
    if len(texts) > len(pool):
        vectors = np.concatenate([vectors, encode(texts[len(pool) :])])
    position = {text: i for i, text in enumerate(texts)}
    encode_seconds = time.perf_counter() - t0

    search = SearchSettings.from_config(cfg)
    if echo is not None:
        k = min(search.top_k, len(pool))
        kind = search.index_kind(len(pool), vectors.shape[1])
        estimate = estimate_index_bytes(len(pool), vectors.shape[1], k, kind)
        echo(f"[mining] {index_summary(kind, len(pool), vectors.shape[1], k, estimate)}")
    (keys,) = text_keys(texts)
    anchor = np.array([position[a] for a in anchors], dtype=np.int64)
    positive = np.array([position[p] for p in positives], dtype=np.int64)
    # The pool is the first len(pool) texts: a view, not a copy; the anchors' rows gathered once
    # for the search and the random baseline.
    anchor_vectors, pool_vectors = vectors[anchor], vectors[: len(pool)]
    mined = mine_hard_negatives(
        anchor_vectors=anchor_vectors,
        positive_vectors=vectors[positive],
        pool_vectors=pool_vectors,
        anchor_keys=keys[anchor],
        positive_keys=keys[positive],
        pool_keys=keys[: len(pool)],
        filters=NegativeFilters.from_config(cfg),
        search=search,
        seed=cfg.run.seed,
    )
    random_pairs = random_pair_similarities(anchor_vectors, pool_vectors, cfg.run.seed)
    report.backend = mined.backend
    report.mined = {
        "mining/encode_s": encode_seconds,
        **mining_metrics(mined, random_pairs=random_pairs, pool_size=len(pool)),
    }

    table, kept_scores = _complete_rows(anchors, positives, pool, mined.negatives, mined.scores)
    report.rows_out = table.num_rows
    report.similarities = {
        "random pairs": random_pairs,
        "positives": mined.table.column("positive_score").to_numpy(),
        "negatives": kept_scores,
    }
    return table, report


def _complete_rows(
    anchors: list[str], positives: list[str], pool: list[str], negatives: np.ndarray, scores: np.ndarray
) -> tuple[pa.Table, np.ndarray]:
    """The output table: the rows that got every negative (``negatives`` are ``(rows, n)``
    pool positions, -1 where missing), and those negatives' similarities to their anchors."""
    complete = (negatives >= 0).all(axis=1)
    columns: dict[str, Any] = {
        "anchor": [a for a, ok in zip(anchors, complete, strict=True) if ok],
        "positive": [p for p, ok in zip(positives, complete, strict=True) if ok],
    }
    pool_array = np.array(pool, dtype=object)
    for j in range(negatives.shape[1]):
        columns[f"negative_{j + 1}"] = pool_array[negatives[complete, j]].tolist()
    return pa.table(columns), scores[complete].ravel()
