"""The offline job's mining, without Ray or MLflow: (anchor, positive) pairs and a model in,
the output table (anchor, positive, negative_1..n) and a :class:`MiningReport` out.

The candidate pool is every distinct positive and the texts of ``data.pool``: with the same
config and model, the negatives are those the training job mines before epoch 1. Each
anchor's ``mining.top_k`` nearest candidates go through
:func:`pipeline.mining.negatives.select_negatives`; anchors left with fewer than
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
from pipeline.mining.anchor_mining import mine_anchors, similarity_percentiles
from pipeline.mining.index import IndexSpec, estimate_index_bytes
from pipeline.mining.negatives import FILTERS, NegativeFilters
from pipeline.mining.text_keys import text_keys
from pipeline.model.encode import encode_texts
from pipeline.tracking.run import ui_command


@dataclass
class MiningReport:
    """What one offline mining run read, kept and wrote (the console summary and the MLflow
    run's ``mining/`` metrics).

    Counts: ``rows_in`` (anchor, positive) rows read, ``rows_out`` written (those with
    ``mining.num_negatives`` negatives after the filters), ``pairs_dropped_empty`` (an empty
    anchor or positive), ``candidate_pool`` distinct positives searched, ``candidates``
    neighbours considered (``top_k`` per anchor), ``kept_before_sampling`` (what every filter
    let through), ``removed`` per filter name, ``anchors_short`` (fewer negatives than asked,
    not written). ``seconds``: wall time per stage.
    """

    rows_in: int = 0
    rows_out: int = 0
    pairs_dropped_empty: int = 0
    negatives_per_row: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    candidate_pool: int = 0
    candidates: int = 0
    kept_before_sampling: int = 0
    anchors_short: int = 0
    negative_similarity: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    index: str = ""
    estimated_index_bytes: int = 0
    similarities: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Cosine similarities for the review histogram: ``positives`` (anchor-positive),
    ``negatives`` (anchor-mined negative, written rows) and ``random pairs`` (anchor-random pool row)."""
    run_id: str = ""
    experiment: str = ""
    tracking_uri: str = ""

    def render(self, output: str) -> str:
        removed = ", ".join(f"{name} {self.removed.get(name, 0)}" for name in FILTERS)
        sims = self.negative_similarity
        timing = ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())
        lines = [
            f"mined {output}",
            f"  rows          {self.rows_out} written of {self.rows_in} pairs ({self.pairs_dropped_empty} empty dropped)",
            f"  negatives     {self.negatives_per_row} per row, from {self.candidate_pool} candidates ({self.index})",
            f"  candidates    {self.candidates} looked at; removed: {removed}; {self.kept_before_sampling} passed",
            f"  too few       {self.anchors_short} anchors had fewer than {self.negatives_per_row} negatives (dropped)",
        ]
        if sims:
            lines.append(
                f"  similarity    negatives mean {sims['mean']:.3f} (p10 {sims['p10']:.3f}, p50 {sims['p50']:.3f}, "
                f"p90 {sims['p90']:.3f}); positives mean {sims['positive_mean']:.3f}"
            )
        lines.append(f"  time          {timing}")
        if self.run_id:
            lines += [
                f"  mlflow run    {self.run_id} (experiment {self.experiment!r})",
                f"  review with   {ui_command(self.tracking_uri)}",
            ]
        return "\n".join(lines)

    def metrics(self) -> dict[str, float]:
        """The report as MLflow metrics (the ``mining/`` chart section)."""
        values = {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "candidate_pool": self.candidate_pool,
            "candidates": self.candidates,
            "kept_before_sampling": self.kept_before_sampling,
            "anchors_short": self.anchors_short,
            **{f"removed_{name}": count for name, count in self.removed.items()},
            **{f"negative_similarity_{k}": v for k, v in self.negative_similarity.items()},
            **{f"{k}_s": v for k, v in self.seconds.items()},
        }
        return {f"mining/{k}": float(v) for k, v in values.items()}


def mine_pairs(
    anchors: list[str],
    positives: list[str],
    model: Any,
    tokenizer: Any,
    cfg: Config,
    device: Any = None,
    echo: Any = None,
    pool_texts: list[str] | None = None,
) -> tuple[pa.Table, MiningReport]:
    """Mine negatives for each (anchor, positive) among the candidate pool: the distinct
    positives and ``pool_texts`` (``data.pool``), as the training miner's pool. Every positive
    any row gives an anchor's text is excluded from its candidates, as the training miner does.

    Returns the output table (``anchor``, ``positive``, ``negative_1``..``negative_n``) and
    the report of what each filter removed.
    """
    device = device or torch.device("cpu")
    mining = cfg.mining
    report = MiningReport(rows_in=len(anchors), negatives_per_row=mining.num_negatives)
    pool = sorted(set(positives).union(pool_texts or ()))
    report.candidate_pool = len(pool)
    t0 = time.perf_counter()

    def encode(texts: list[str]) -> np.ndarray:
        return encode_texts(model, tokenizer, texts, cfg.data.max_seq_len, mining.encode_batch_size, device)

    # Each distinct text is encoded once: anchors repeat (SNLI premises) or are positives too.
    # The pool comes first, so pool position i is text position i.
    texts = pool + sorted(set(anchors).union(positives).difference(pool))
    vectors = encode(pool)
    if len(texts) > len(pool):
        vectors = np.concatenate([vectors, encode(texts[len(pool) :])])
    position = {text: i for i, text in enumerate(texts)}
    report.seconds["encode"] = time.perf_counter() - t0

    k = min(mining.top_k, len(pool))
    spec = IndexSpec.from_section(mining)
    report.index = spec.resolve(len(pool))
    report.estimated_index_bytes = estimate_index_bytes(len(pool), vectors.shape[1], k, report.index, spec)
    if echo is not None:
        echo(
            f"[mining] {report.index} index over {len(pool)} x {vectors.shape[1]} vectors, k={k}: "
            f"about {report.estimated_index_bytes / 2**20:.1f} MiB"
        )
    (keys,) = text_keys(texts)
    mined = mine_anchors(
        vectors, keys, np.array([position[a] for a in anchors]), np.array([position[p] for p in positives]),
        np.arange(len(pool)), NegativeFilters.from_config(cfg), k, spec, mining.num_gpus > 0, cfg.run.seed, cfg.run.seed,
    )  # fmt: skip
    chosen, knn = mined.selected, mined.knn
    report.index = knn.backend
    report.seconds.update(index=knn.index_seconds, search=knn.search_seconds, filter=mined.filter_seconds)
    report.candidates, report.kept_before_sampling = chosen.candidates, chosen.kept
    report.removed, report.anchors_short = chosen.removed, chosen.anchors_short

    table, kept_scores = _complete_rows(anchors, positives, pool, chosen.indices, chosen.scores)
    report.rows_out = table.num_rows
    report.similarities = {
        "random pairs": mined.random_pairs,
        "positives": mined.positive_scores,
        "negatives": kept_scores,
    }
    if len(kept_scores):
        positive_mean = float(mined.positive_scores.mean())
        report.negative_similarity = {**similarity_percentiles(kept_scores), "positive_mean": positive_mean}
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
