"""The offline job's mining: (anchor, positive) rows and a model folder in, the output table
(anchor, positive, negative_1..n) and a :class:`MiningReport` out.

It is the training job's miner (:class:`~pipeline.mining.miner.HardNegativeMiner`), run once
with the model folder's weights: the same shards (``mining.shards``: one in this process, more
as actors of their own, so that no process holds every vector), the same search, filters and
seeds. With the same config and model, its negatives are the training job's before epoch 1, row
for row. Anchors left with fewer negatives than asked are dropped from the output and counted.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.batching.negative_draw import draw_negatives
from pipeline.config.schema import Config
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.tokenize import tokenize_texts
from pipeline.data.triplets import Triplets
from pipeline.mining.miner import HardNegativeMiner
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import FILTERS, NegativeFilters
from pipeline.model.accel import compute_device, mining_dtype
from pipeline.model.folders import load_tokenizer, pack_dir
from pipeline.tracking.run import ui_command

FIRST_VERSION = 1
"""The version of the training job's mining before epoch 1 (it seeds the IVF sample and the
draws): the offline job mines as that one does."""


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
    """Cosine similarities for the review histogram, as a training refresh draws it:
    ``random pairs`` (anchor-random pool text), ``positives`` (anchor-positive) and the mined
    negatives (anchor-negative)."""
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
    texts: DistinctTexts,
    triplets: Triplets,
    model_dir: Path,
    cfg: Config,
    *,
    shards: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> tuple[pa.Table, MiningReport]:
    """Mine each row's negatives among the candidate pool (``data.pool`` and the distinct
    positives, :meth:`~pipeline.data.triplets.Triplets.candidate_pool`), as the training job's
    miner does before epoch 1: tokenize the texts, encode them with the folder's weights where
    ``mining.num_gpus`` and ``mining.label_selector`` say, search, filter
    (``mining.num_negatives`` an anchor, chosen by ``mining.sampling``) and add
    ``mining.random_negatives`` random pool texts.

    Args:
        texts: the distinct texts the rows name, in the object store.
        triplets: the rows as positions into ``texts``.
        model_dir: the model folder.
        cfg: the run config.
        shards: the miner's shards (``mining.shards`` as the job resolved it); None: as
            :meth:`~pipeline.mining.miner_settings.MinerSettings.from_config`.
        echo: where the tokenizing line goes.

    Returns:
        The output table (``anchor``, ``positive``, ``negative_1``..) of the rows that got every
        negative, and the report of what each filter removed.
    """
    started = time.perf_counter()
    blocks, token_stats = tokenize_texts(texts, load_tokenizer(model_dir), cfg.data)
    if echo is not None:
        echo(f"[data] tokenized {token_stats.describe()} in {time.perf_counter() - started:.1f}s")
    # The training miner keeps a deeper list for each epoch's draw (sampling: random); a file
    # of negatives holds the ones drawn: by the filters, or after a denoising teacher kept the
    # window's survivors, drawn from those as an epoch draws them.
    settings = MinerSettings.from_config(cfg, shards=shards)
    if settings.denoise_margin is None:
        settings = dataclasses.replace(settings, filters=NegativeFilters.from_config(cfg))
    miner = HardNegativeMiner(blocks, pack_dir(model_dir), settings, triplets=triplets, texts=texts)
    try:
        mined = miner.refresh(None, version=FIRST_VERSION, step=0)
    finally:
        miner.shards.stop()
    assert mined.negatives is not None  # a miner without run storage hands the column back
    negatives, scores = mined.negatives, mined.teacher_scores
    if settings.denoise_margin is not None and cfg.negatives_mined > cfg.mining.num_negatives:
        negatives, scores = draw_negatives(
            negatives, mined=cfg.negatives_mined, keep=cfg.mining.num_negatives, seed=cfg.run.seed,
            teacher_scores=scores,
        )  # fmt: skip
    device = compute_device(use_gpu=settings.use_gpu)
    report = MiningReport(
        rows_in=len(triplets),
        negatives_per_row=mined.negatives.shape[1],
        backend=miner.shards.backend,
        encode_device=device.type,
        encode_dtype=mining_dtype(device),
        mined={name: value for name, value in mined.metrics.items() if name != "mining/plan_version"},
        # One mining, not a refresh of many: its negatives need no version in the histogram.
        similarities={
            name.removesuffix(f" v{FIRST_VERSION}"): values for name, values in mined.similarities.items()
        },
    )
    table = _complete_rows(texts.gather().column("text"), triplets, negatives, scores)
    report.rows_out = table.num_rows
    return table, report


def _complete_rows(
    strings: pa.ChunkedArray, triplets: Triplets, negatives: np.ndarray, teacher_scores: np.ndarray | None
) -> pa.Table:
    """The output table: the rows that got every negative (``negatives`` are ``(rows, n)`` text
    positions, -1 where missing), as texts; with the teacher's ``(rows, 1 + n)`` scores, the
    columns its peers distil from: ``label``, the teacher's margins ``score(anchor, positive) -
    score(anchor, negative_j)`` (sentence-transformers' ``MarginMSELoss`` labels), and
    ``pos_scores`` / ``neg_scores`` (FlagEmbedding's distillation keys)."""
    complete = np.flatnonzero((negatives >= 0).all(axis=1))
    columns = {
        "anchor": strings.take(triplets.anchor[complete]),
        "positive": strings.take(triplets.positive[complete]),
    }
    for j in range(negatives.shape[1]):
        columns[f"negative_{j + 1}"] = strings.take(negatives[complete, j])
    if teacher_scores is not None:
        scores = teacher_scores[complete].astype(np.float32)  # (rows, 1 + n): the positive's first

        def lists(values: np.ndarray) -> pa.Array:
            return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel(), pa.float32()), values.shape[1])

        columns["label"] = lists(scores[:, :1] - scores[:, 1:])
        columns["pos_scores"] = lists(scores[:, :1])
        columns["neg_scores"] = lists(scores[:, 1:])
    return pa.table(columns)
