"""Retrieval evaluation of an encoder on :mod:`retrieval sets <pipeline.evaluation.retrieval_sets>`:
nDCG@10, MRR@10, Recall@1/@10/@100 (x 100).

The same mechanism as STS (:mod:`pipeline.evaluation.scoring`) serves ``jobs/evaluate.py`` and
the train loop: :class:`RetrievalEvalSet` tokenizes the distinct texts of every set's queries
and corpus once, something encodes them (a model folder here, the live model sharded over the
workers in training), and :func:`score_retrieval_embeddings` turns the embeddings into one
:class:`RetrievalSetScore` per set.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.evaluation.distinct_texts import DistinctTexts
from pipeline.evaluation.folder_encoder import FolderEncoder
from pipeline.evaluation.retrieval_metrics import RankingMetrics, ranking_metrics
from pipeline.evaluation.retrieval_sets import RetrievalSet, read_retrieval_sets
from pipeline.evaluation.text_table import text_table
from pipeline.evaluation.unit_rows import unit_rows

RETRIEVAL_METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100")
"""The per-set metrics, as they end the metric keys (``retrieval_<set>_ndcg_at_10`` ...)."""


def metric_key(name: str) -> str:
    """A set or file name as it goes into a metric key (characters MLflow refuses become ``_``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@dataclass(frozen=True)
class RetrievalSetScore(RankingMetrics):
    """The evaluation of one retrieval set: its :class:`RankingMetrics` (``skipped`` also
    counts the queries the set's qrels do not judge), with the set's name and path."""

    name: str = field(kw_only=True)
    path: str = field(kw_only=True)

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    def metrics(self) -> dict[str, float]:
        """MLflow metric names for this set: ``retrieval_<name>_ndcg_at_10``, ``..._mrr_at_10``,
        ``..._recall_at_1``, ``..._recall_at_10``, ``..._recall_at_100`` (NaN ones left out)."""
        key = metric_key(self.name)
        out = {f"retrieval_{key}_{m}": getattr(self, m) for m in RETRIEVAL_METRICS}
        return {k: v for k, v in out.items() if not math.isnan(v)}


class RetrievalEvalSet(DistinctTexts):
    """The distinct texts of several retrieval sets (queries and corpora), tokenized once;
    ``rows`` holds each set's (query rows, document rows)."""

    def __init__(self, sets: list[RetrievalSet], tokenizer: Any, max_seq_len: int):
        super().__init__([(item.queries, item.docs) for item in sets], tokenizer, max_seq_len)
        self.sets = sets

    def describe(self) -> str:
        """``dev (400 queries, 3951 documents), ...``."""
        return ", ".join(f"{s.name} ({len(s.queries)} queries, {len(s.docs)} documents)" for s in self.sets)


def set_vectors(
    eval_set: RetrievalEvalSet, embeddings: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, list[list[int]]]]:
    """Per set of ``eval_set``, from raw (un-normalised) embeddings of its texts (row order of
    ``eval_set.table``): its queries' and documents' unit vectors (float64) and, for each query,
    the documents with its own text, which are never its candidates."""
    if len(embeddings) != eval_set.num_sentences:
        raise ValueError(f"{len(embeddings)} embeddings for {eval_set.num_sentences} texts")
    unit = unit_rows(embeddings)
    out = []
    for query_rows, doc_rows in eval_set.rows:
        docs_of_row: dict[int, list[int]] = {}
        for doc, row in enumerate(doc_rows.tolist()):
            docs_of_row.setdefault(row, []).append(doc)
        own_text = [docs_of_row.get(row, []) for row in query_rows.tolist()]
        out.append((unit[query_rows], unit[doc_rows], own_text))
    return out


def score_retrieval_embeddings(eval_set: RetrievalEvalSet, embeddings: np.ndarray) -> list[RetrievalSetScore]:
    """One score per set from raw (un-normalised) embeddings of ``eval_set``'s texts, row order
    of ``eval_set.table``; ranked by cosine similarity."""
    scores = []
    for item, (queries, docs, own_text) in zip(eval_set.sets, set_vectors(eval_set, embeddings), strict=True):
        got = ranking_metrics(queries, docs, item.relevance, own_text)
        scores.append(
            RetrievalSetScore(
                **{**asdict(got), "skipped": got.skipped + item.unjudged}, name=item.name, path=item.path
            )
        )
    return scores


def encoded_eval_set(
    model_dir: str | Path,
    sets: list[RetrievalSet] | list[str],
    batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> tuple[RetrievalEvalSet, np.ndarray]:
    """Retrieval sets (read ones, or their paths: BEIR folders or pair files) and the raw
    embeddings of their texts under a model folder (:meth:`FolderEncoder.load
    <pipeline.evaluation.folder_encoder.FolderEncoder.load>`: its device and batch size)."""
    if any(isinstance(item, str) for item in sets):
        sets = read_retrieval_sets([str(item) for item in sets])
    encoder = FolderEncoder.load(model_dir, batch_size=batch_size, max_seq_len=max_seq_len)
    eval_set = RetrievalEvalSet(sets, encoder.tokenizer, encoder.max_seq_len)
    embeddings = encoder.encode_distinct(eval_set)
    return eval_set, embeddings


def evaluate_retrieval_model_dir(
    model_dir: str | Path,
    sets: list[RetrievalSet] | list[str],
    batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> list[RetrievalSetScore]:
    """Evaluate a model folder on retrieval sets (:func:`encoded_eval_set`, then
    :func:`score_retrieval_embeddings`)."""
    return score_retrieval_embeddings(*encoded_eval_set(model_dir, sets, batch_size, max_seq_len))


def format_retrieval_table(scores: list[RetrievalSetScore], title: str | None = None) -> str:
    """A plain-text table, one row per set."""
    header = ["set", "queries", "corpus", "ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100"]
    body = [
        [s.name, str(s.queries), str(s.corpus)] + [f"{getattr(s, m):.2f}" for m in RETRIEVAL_METRICS]
        for s in scores
    ]
    return text_table(header, body, title)
