"""Offline hard-negative mining: (anchor, positive) pairs in, (anchor, positive, negative_1..n) out.

Input is a text file (one sentence per line; the anchor is its own positive, as in
unsupervised SimCSE) or pairs in csv/tsv/jsonl/parquet. The candidate pool is every
distinct positive. Each anchor's ``mining.top_k`` nearest candidates go through
:func:`pipeline.negatives.select_negatives`; anchors left with fewer than
``mining.num_negatives`` negatives are dropped from the output and counted. The output
(parquet or jsonl, by extension) loads as a sentence-transformers training dataset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.config import Config
from pipeline.data import DataError, read_pairs
from pipeline.index import estimate_index_bytes
from pipeline.negatives import FILTERS, mine_anchor_negatives, text_keys


@dataclass
class MiningReport:
    rows_in: int = 0
    rows_out: int = 0
    pairs_dropped_empty: int = 0
    candidate_pool: int = 0
    negatives_per_row: int = 0
    candidates: int = 0
    kept_before_sampling: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    anchors_short: int = 0
    negative_similarity: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    index: str = ""
    estimated_index_bytes: int = 0

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
        return "\n".join(lines)


def mine_pairs(
    anchors: list[str],
    positives: list[str],
    model: Any,
    tokenizer: Any,
    cfg: Config,
    device: Any = None,
    echo: Any = None,
) -> tuple[pa.Table, MiningReport]:
    """Mine negatives for each (anchor, positive) among the distinct positives.

    Returns the output table (``anchor``, ``positive``, ``negative_1``..``negative_n``) and
    the report of what each filter removed.
    """
    import torch

    from pipeline.model import encode_texts

    device = device or torch.device("cpu")
    mining = cfg.mining
    report = MiningReport(rows_in=len(anchors), negatives_per_row=mining.num_negatives)
    pool = sorted(set(positives))
    report.candidate_pool = len(pool)
    t0 = time.perf_counter()

    def encode(texts: list[str]) -> np.ndarray:
        return encode_texts(model, tokenizer, texts, cfg.data.max_seq_len, mining.encode_batch_size, device)

    pool_vectors = encode(pool)
    position = {text: i for i, text in enumerate(pool)}
    # Each distinct text is encoded once: anchors repeat (SNLI premises) or are positives too.
    extra = sorted(set(anchors).difference(position))
    position.update({text: len(pool) + i for i, text in enumerate(extra)})
    vectors = np.concatenate([pool_vectors, encode(extra)]) if extra else pool_vectors
    anchor_vectors = vectors[np.array([position[a] for a in anchors])]
    positive_rows = np.array([position[p] for p in positives])
    report.seconds["encode"] = time.perf_counter() - t0

    k = min(mining.top_k, len(pool))
    spec = mining.index_spec()
    report.index = spec.resolve(len(pool))
    report.estimated_index_bytes = estimate_index_bytes(
        len(pool), pool_vectors.shape[1], k, report.index, spec
    )
    if echo is not None:
        echo(
            f"[mining] {report.index} index over {len(pool)} x {pool_vectors.shape[1]} vectors, k={k}: "
            f"about {report.estimated_index_bytes / 2**20:.1f} MiB"
        )
    pool_keys, anchor_keys = text_keys(pool, anchors)
    t1 = time.perf_counter()
    mined = mine_anchor_negatives(
        anchor_vectors, pool_vectors[positive_rows], pool_vectors, anchor_keys, pool_keys[positive_rows], pool_keys,
        mining.negative_filters(), k, spec=spec, use_gpu=mining.num_gpus > 0, seed=cfg.run.seed,
    )  # fmt: skip
    knn, chosen, positive_scores = mined.knn, mined.selected, mined.positive_scores
    report.index = knn.backend
    report.seconds["index"] = knn.index_seconds
    report.seconds["search"] = knn.search_seconds
    report.seconds["filter"] = time.perf_counter() - t1 - knn.index_seconds - knn.search_seconds
    report.candidates, report.kept_before_sampling = chosen.candidates, chosen.kept
    report.removed, report.anchors_short = chosen.removed, chosen.anchors_short

    complete = (chosen.indices >= 0).all(axis=1)
    columns: dict[str, Any] = {
        "anchor": [a for a, ok in zip(anchors, complete, strict=True) if ok],
        "positive": [p for p, ok in zip(positives, complete, strict=True) if ok],
    }
    pool_array = np.array(pool, dtype=object)
    for j in range(mining.num_negatives):
        columns[f"negative_{j + 1}"] = pool_array[chosen.indices[complete, j]].tolist()
    report.rows_out = int(complete.sum())
    kept_scores = chosen.scores[complete].ravel()
    if len(kept_scores):
        report.negative_similarity = {
            "mean": float(kept_scores.mean()),
            "p10": float(np.percentile(kept_scores, 10)),
            "p50": float(np.percentile(kept_scores, 50)),
            "p90": float(np.percentile(kept_scores, 90)),
            "positive_mean": float(positive_scores.mean()),
        }
    return pa.table(columns), report


def write_triplets(table: pa.Table, output: str) -> None:
    """Parquet or jsonl by the output's extension."""
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif suffix in (".jsonl", ".json"):
        import json

        with path.open("w", encoding="utf-8") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise DataError(f"--output: {output} must end in .parquet or .jsonl")


def run_mine_job(cfg: Config, output: str, echo: Any = print) -> MiningReport:
    """The offline mining job: read pairs, load the model, mine, write, log to MLflow.

    Raises:
        ConfigError, DataError, ValueError: one-line problems; the MLflow run is marked FAILED.
    """
    import tempfile
    from datetime import datetime

    from pipeline.cluster import ray_session
    from pipeline.data import check_corpus_columns, check_corpus_path
    from pipeline.model import (
        check_model_path,
        fetch_pretrained_dir,
        load_sentence_encoder,
        load_tokenizer,
        quiet_libraries,
    )
    from pipeline.preflight import preflight_mine
    from pipeline.tracking import resolve_tracking_uri, start_or_resume_run

    if not cfg.data.path:
        raise DataError("--input (data.path) is required")
    if Path(output).suffix.lower() not in (".parquet", ".pq", ".jsonl", ".json"):
        raise DataError(f"--output: {output} must end in .parquet or .jsonl")
    if not cfg.model.name_or_path:
        raise DataError("--model (model.name_or_path) is required")
    preflight_mine(cfg, output)
    check_corpus_path(cfg.data.path)
    check_corpus_columns(cfg.data, pairs=True)  # a text file is sentences: no columns
    check_model_path(cfg.model.name_or_path)
    tracking_uri = resolve_tracking_uri(cfg.tracking.uri)
    run_name = cfg.run.name or datetime.now().strftime("mine-%Y%m%d-%H%M%S")
    tracked = start_or_resume_run(tracking_uri, cfg.tracking.experiment, run_name)
    quiet_libraries()
    with tracked.failing_on_error(), ray_session(cfg):
        tracked.log_params(
            {k: v for k, v in cfg.flat().items() if k.split(".")[0] in ("data", "model", "mining")}
        )
        tracked.set_tags({"simcse.job": "mine", "simcse.output": output})
        anchors, positives, _, rows = read_pairs(cfg.data)
        echo(f"[data] {cfg.data.path}: {len(anchors)} (anchor, positive) pairs")
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = fetch_pretrained_dir(cfg.model.name_or_path, tmp)
            tokenizer = load_tokenizer(model_dir)
            model = load_sentence_encoder(model_dir, pooler=cfg.model.pooler)
        table, report = mine_pairs(anchors, positives, model, tokenizer, cfg, echo=echo)
        report.rows_in = rows
        report.pairs_dropped_empty = rows - len(anchors)
        write_triplets(table, output)
        metrics = {
            "rows_in": report.rows_in,
            "rows_out": report.rows_out,
            "candidates": report.candidates,
            "kept_before_sampling": report.kept_before_sampling,
            "anchors_short": report.anchors_short,
            **{f"removed_{name}": count for name, count in report.removed.items()},
            **{f"negative_similarity_{k}": v for k, v in report.negative_similarity.items()},
            **{f"{k}_s": v for k, v in report.seconds.items()},
        }
        from pipeline.tracking import MetricLogger

        logger = MetricLogger(tracking_uri, tracked.run_id)
        logger.log({f"mining_{k}": float(v) for k, v in metrics.items()}, step=0)
        logger.flush()
    tracked.finish()
    return report
