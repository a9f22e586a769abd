"""STS evaluation of an encoder: Spearman x 100, alignment, uniformity, and paraphrase retrieval
(MRR@10, recall@1) on the same files; ``jobs/evaluate.py`` also scores a post-hoc whitening.

One mechanism serves ``jobs/evaluate.py`` (a model folder on disk) and the train loop (the
live model, its sentences sharded over the workers): :class:`STSEvalSet` tokenizes the unique
sentences of all STS files once, something encodes them to raw pooled embeddings, and
:func:`score_embeddings` turns those into one :class:`STSScore` per file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import DataError
from pipeline.evaluation.diagnostics import alignment, uniformity
from pipeline.evaluation.distinct_texts import DistinctTexts
from pipeline.evaluation.folder_encoder import FolderEncoder
from pipeline.evaluation.retrieval import nan_mean, paraphrase_retrieval
from pipeline.evaluation.set_names import with_distinct_names
from pipeline.evaluation.sts import STSPairs, read_sts, spearman
from pipeline.evaluation.text_table import text_table
from pipeline.evaluation.unit_rows import unit_rows
from pipeline.evaluation.whitening import Whitening, fit_whitening


@dataclass
class STSScore:
    """The evaluation of one STS file."""

    name: str
    pairs: int
    spearman: float
    """Spearman x 100 of cosine similarity against the gold scores."""
    alignment: float
    """Over the positive pairs (gold >= :attr:`STSPairs.positive_threshold`; NaN if none)."""
    uniformity: float
    """Over all of the file's sentences."""
    spearman_whitened: float | None = None
    """Spearman x 100 after a post-hoc whitening (``jobs/evaluate.py``; None: not evaluated)."""
    mrr_at_10: float = float("nan")
    """Paraphrase retrieval (:mod:`pipeline.evaluation.retrieval`): MRR@10 x 100 of finding each
    positive pair's sentence2 among the file's sentences from its sentence1 (NaN: no positives)."""
    recall_at_1: float = float("nan")
    """Paraphrase retrieval: recall@1 x 100 (NaN: no positives)."""
    retrieval_queries: int = 0
    """Positive pairs the retrieval scores average over."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """MLflow metric names for this file: ``sts_<name>_spearman`` and friends
        (``sts_<name>_mrr_at_10``, ``sts_<name>_recall_at_1``)."""
        key = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        out = {
            f"sts_{key}_spearman": self.spearman,
            f"sts_{key}_alignment": self.alignment,
            f"sts_{key}_uniformity": self.uniformity,
            f"sts_{key}_mrr_at_10": self.mrr_at_10,
            f"sts_{key}_recall_at_1": self.recall_at_1,
        }
        if self.spearman_whitened is not None:
            out[f"sts_{key}_spearman_whitened"] = self.spearman_whitened
        return {k: v for k, v in out.items() if not math.isnan(v)}


class STSEvalSet(DistinctTexts):
    """The unique sentences of several STS files, tokenized once; ``rows`` holds each file's
    (first sentences' rows, second sentences' rows)."""

    def __init__(self, files: list[STSPairs], tokenizer: Any, max_seq_len: int):
        super().__init__([(pairs.sentences1, pairs.sentences2) for pairs in files], tokenizer, max_seq_len)
        self.files = files


def read_sts_files(paths: list[str]) -> list[STSPairs]:
    """Read every file (its format told by name and first line), giving repeated names a
    numeric suffix so metric keys stay distinct."""
    return with_distinct_names([read_sts(path) for path in paths])


def _cosine_spearman(pairs: STSPairs, unit: np.ndarray, left: np.ndarray, right: np.ndarray) -> float:
    """Spearman x 100 of the pairs' cosines, from L2-normalised rows ``unit``."""
    return 100.0 * spearman((unit[left] * unit[right]).sum(1), pairs.scores)


def score_embeddings(
    eval_set: STSEvalSet,
    embeddings: np.ndarray,
    whitening: Whitening | None = None,
) -> list[STSScore]:
    """One score per STS file from raw (un-normalised) embeddings of ``eval_set``'s sentences.

    Pairs with gold ``>=`` the file's :attr:`~STSPairs.positive_threshold` are the alignment
    positives and the paraphrase retrieval queries; retrieval uses the plain (not whitened)
    embeddings.

    Args:
        embeddings: ``(eval_set.num_sentences, dim)``, row order of ``eval_set.table``.
        whitening: also report the Spearman of whitened embeddings.
    """
    if len(embeddings) != eval_set.num_sentences:
        raise ValueError(f"{len(embeddings)} embeddings for {eval_set.num_sentences} sentences")
    unit = unit_rows(embeddings)
    unit_whitened = unit_rows(whitening.apply(embeddings)) if whitening is not None else None
    texts = eval_set.table.column("text").to_pylist()
    scores = []
    for pairs, (left, right) in zip(eval_set.files, eval_set.rows, strict=True):
        positive = pairs.scores >= pairs.positive_threshold
        file_rows = np.unique(np.concatenate([left, right]))
        retrieval = paraphrase_retrieval(
            unit, texts, pool_rows=file_rows, query_rows=left[positive], answer_rows=right[positive]
        )
        scores.append(
            STSScore(
                name=pairs.name,
                pairs=len(pairs),
                spearman=_cosine_spearman(pairs, unit, left, right),
                alignment=alignment(unit[left[positive]], unit[right[positive]]),
                uniformity=uniformity(unit[file_rows]),
                spearman_whitened=(
                    _cosine_spearman(pairs, unit_whitened, left, right) if unit_whitened is not None else None
                ),
                mrr_at_10=retrieval.mrr_at_10,
                recall_at_1=retrieval.recall_at_1,
                retrieval_queries=retrieval.queries,
            )
        )
    return scores


def evaluate_model_dir(
    model_dir: str | Path,
    sts_paths: list[str],
    *,
    batch_size: int | None = None,
    max_seq_len: int | None = None,
    whitening_texts: list[str] | None = None,
    whitening_dim: int | None = None,
) -> list[STSScore]:
    """Evaluate a model folder on STS files (:meth:`FolderEncoder.load
    <pipeline.evaluation.folder_encoder.FolderEncoder.load>`: its device and batch size).

    With ``whitening_texts``, a whitening fitted here on them (encoded like the STS sentences)
    is reported as ``spearman_whitened`` beside the plain score.
    """
    files = read_sts_files(sts_paths)
    encoder = FolderEncoder.load(model_dir, batch_size=batch_size, max_seq_len=max_seq_len)
    eval_set = STSEvalSet(files, encoder.tokenizer, encoder.max_seq_len)
    embeddings = encoder.encode_distinct(eval_set)
    whitening = None
    if whitening_texts:
        whitening = fit_whitening(encoder.encode_texts(whitening_texts), whitening_dim)
    return score_embeddings(eval_set, embeddings, whitening)


def average_row(scores: list[STSScore]) -> STSScore:
    """The unweighted mean over files (as SentEval reports its STS average)."""
    whitened = [s.spearman_whitened for s in scores]
    aligned = [s.alignment for s in scores if not math.isnan(s.alignment)]  # NaN: a file without positives
    return STSScore(
        name="average",
        pairs=sum(s.pairs for s in scores),
        spearman=float(np.mean([s.spearman for s in scores])),
        alignment=float(np.mean(aligned)) if aligned else float("nan"),
        uniformity=float(np.mean([s.uniformity for s in scores])),
        spearman_whitened=float(np.mean(whitened)) if all(w is not None for w in whitened) else None,
        mrr_at_10=nan_mean([s.mrr_at_10 for s in scores]),
        recall_at_1=nan_mean([s.recall_at_1 for s in scores]),
        retrieval_queries=sum(s.retrieval_queries for s in scores),
    )


def format_table(scores: list[STSScore], title: str | None = None) -> str:
    """A plain-text table, one row per file (and an average row for several)."""
    rows = list(scores) + ([average_row(scores)] if len(scores) > 1 else [])
    whitened = any(s.spearman_whitened is not None for s in rows)
    header = ["file", "pairs", "spearman"] + (["whitened"] if whitened else [])
    header += ["mrr@10", "recall@1", "alignment", "uniformity"]
    body = []
    for s in rows:
        cells = [s.name, str(s.pairs), f"{s.spearman:.2f}"]
        if whitened:
            cells.append("" if s.spearman_whitened is None else f"{s.spearman_whitened:.2f}")
        cells += [f"{s.mrr_at_10:.2f}", f"{s.recall_at_1:.2f}", f"{s.alignment:.3f}", f"{s.uniformity:.3f}"]
        body.append(cells)
    return text_table(header, body, title)


def score_summary(scores: list[STSScore]) -> dict[str, Any]:
    """JSON-ready summary: ``spearman`` and ``pairs`` (average and total over files), the other
    averages, and ``files`` with one entry per file. NaN becomes null."""
    overall = scores[0] if len(scores) == 1 else average_row(scores)

    def clean(record: dict[str, Any]) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}

    summary = clean({k: v for k, v in overall.as_dict().items() if k != "name"})
    summary["files"] = [clean(s.as_dict()) for s in scores]
    return summary


def read_sentences(path: str | Path, max_rows: int, seed: int = 0) -> list[str]:
    """Non-empty lines of a text file; a fixed random sample of ``max_rows`` when it has more."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"corpus file not found: {p}")
    lines = [line.strip() for line in p.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(len(lines), max_rows, replace=False))
        lines = [lines[i] for i in keep]
    return lines
