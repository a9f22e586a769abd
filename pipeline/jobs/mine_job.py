"""Offline hard-negative mining as a job: (anchor, positive) pairs in, (anchor, positive,
negative_1..n) out, with its own MLflow run.

Input is a text file (one sentence per line; the anchor is its own positive, as in
unsupervised SimCSE) or pairs as the training job reads them (csv/tsv/jsonl/parquet columns,
labelled rows, headerless ``pairs_tsv``); the mining itself is
:func:`pipeline.jobs.pair_mining.mine_pairs`. The output (parquet or jsonl, by extension)
loads as a sentence-transformers training dataset.

The job's MLflow run carries what the training run carries where it applies: the input as
a dataset (context ``mining``), commit and versions, the ``mining/`` metrics, the console
summary as its description, and a similarity histogram and a sample of the output.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config.schema import Config
from pipeline.core.errors import DataError
from pipeline.data.columns import input_schema
from pipeline.data.input_checks import check_corpus_columns, check_corpus_path
from pipeline.data.pairs import index_pairs, load_pairs
from pipeline.data.tokenized import dataset_digest
from pipeline.jobs.pair_mining import MiningReport, mine_pairs
from pipeline.model.encoder import pooler_warning
from pipeline.model.folders import check_model_path, fetch_pretrained_dir, quiet_libraries
from pipeline.runtime.cluster import ray_session
from pipeline.runtime.nodes import plan_reads
from pipeline.runtime.preflight import preflight_mine
from pipeline.tracking.context import InputDataset, log_run_context
from pipeline.tracking.plots import similarity_histogram_png
from pipeline.tracking.run import (
    TrackedRun,
    resolve_tracking_uri,
    run_description,
    start_or_resume_run,
)


def write_triplets(table: pa.Table, output: str) -> None:
    """Parquet or jsonl by the output's extension."""
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        pq.write_table(table, path)
    elif suffix in (".jsonl", ".json"):
        with path.open("w", encoding="utf-8") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise DataError(f"--output: {output} must end in .parquet or .jsonl")


def run_mine_job(cfg: Config, output: str, echo: Any = print, debug: bool = False) -> MiningReport:
    """The offline mining job: read pairs, load the model, mine, write, log to MLflow.
    ``debug`` (the job's ``--debug``) turns Ray Data's progress bars on.

    Raises:
        ConfigError, DataError, ValueError: one-line problems; the MLflow run is marked FAILED.
    """

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
    if cfg.mining.teacher.model:
        check_model_path(cfg.mining.teacher.model, key="mining.teacher.model")
    tracking_uri = resolve_tracking_uri(cfg.tracking.uri)
    run_name = cfg.run.name or datetime.now().strftime("mine-%Y%m%d-%H%M%S")
    tracked = start_or_resume_run(tracking_uri, cfg.tracking.experiment, run_name)
    echo(f"[run] mining run {run_name!r}: MLflow run {tracked.run_id} at {tracking_uri}")
    quiet_libraries()
    with tracked.failing_on_error(), ray_session(cfg, debug):
        tracked.log_params(
            {k: v for k, v in cfg.flat().items() if k.split(".")[0] in ("data", "model", "mining")}
        )
        tracked.set_tags(
            {"simcse.job": "mine", "simcse.output": output, "simcse.model": cfg.model.name_or_path}
        )
        # Submitted to a cluster, the input may sit on the driver's disk only.
        reads = plan_reads({"data.path": cfg.data.path, "data.pool": cfg.data.pool}, echo)
        read = load_pairs(cfg.data, reads=reads)
        texts, pairs = index_pairs(read, cfg.data.tokenize_num_cpus)
        rows = read.rows_read
        pool_note = f", pool {cfg.data.pool}: {len(read.pool)} texts" if read.pool is not None else ""
        echo(f"[data] {cfg.data.path}: {len(pairs)} (anchor, positive) pairs{pool_note}")
        dataset = InputDataset(
            source=cfg.data.path,
            digest=dataset_digest(texts.ids, pairs),
            rows=len(pairs),
            kind="pairs",
            columns=input_schema(cfg.data, pairs=True),
            context="mining",
        )
        no_commit = log_run_context(tracked, dataset)
        if no_commit:
            echo(f"[run] {no_commit}")
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = fetch_pretrained_dir(cfg.model.name_or_path, tmp)
            if pooler_line := pooler_warning(model_dir, cfg.model.pooler):
                echo(pooler_line)
            table, report = mine_pairs(texts, pairs, model_dir, cfg, echo=echo)
        tracked.set_tags({"simcse.mining_dtype": report.encode_dtype})
        report.rows_in = rows
        report.pairs_dropped_empty = read.empty_dropped
        report.run_id, report.experiment, report.tracking_uri = (
            tracked.run_id,
            cfg.tracking.experiment,
            tracking_uri,
        )
        write_triplets(table, output)
        tracked.log_metrics(report.metrics(), step=0)
        log_mining_review(tracked, table, report, output)
    tracked.finish()
    return report


def log_mining_review(tracked: TrackedRun, table: pa.Table, report: MiningReport, output: str) -> None:
    """What a reviewer opens on the mining run: the console summary as its description, and
    under ``review/`` the similarity histogram (random pairs, positives, mined negatives) and
    the first rows of the output as a markdown table."""

    tracked.set_note(run_description(report.render(output)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        series = {name: values for name, values in report.similarities.items() if len(values)}
        if series:
            similarity_histogram_png(
                series, "cosine similarity to the anchor", str(folder / "similarity.png")
            )
        (folder / "sample_triplets.md").write_text(sample_markdown(table, SAMPLE_ROWS))
        tracked.log_artifacts(folder, "review")


SAMPLE_ROWS = 50


def sample_markdown(table: pa.Table, rows: int) -> str:
    """The first ``rows`` rows of the mined output as a markdown table (cells shortened)."""

    def cell(text: str) -> str:
        text = text.replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= 120 else text[:117] + "..."

    head = table.slice(0, rows).to_pylist()
    columns = table.column_names
    lines = [
        f"# First {len(head)} of {table.num_rows} mined rows\n",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(cell(str(row[c])) for c in columns) + " |" for row in head]
    return "\n".join(lines) + "\n"
