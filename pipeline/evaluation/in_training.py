"""STS and retrieval evaluation inside the train loop, sharded over the workers.

Every worker encodes its slice of the STS sentences and of the retrieval sets' texts, the
slices are gathered to rank 0, and rank 0 scores them. Evaluation
then costs each worker 1/world of the encoding instead of idling while rank 0 encodes
everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.config.eval_section import SELECTABLE_METRICS, EvalSection
from pipeline.core.errors import ConfigError
from pipeline.evaluation.retrieval_scoring import (
    RetrievalEvalSet,
    RetrievalSetScore,
    metric_key,
    score_retrieval_embeddings,
)
from pipeline.evaluation.scoring import STSEvalSet, STSScore, score_embeddings
from pipeline.model.encode import sharded_encode
from pipeline.model.encoder import SentenceEncoder


@dataclass
class EvalOutcome:
    """Rank 0's result of one evaluation."""

    scores: list[STSScore]
    retrieval: list[RetrievalSetScore] = field(default_factory=list)
    select_by: str | None = None
    """``eval.select_by``: the metric that picks the best checkpoint (None: the default)."""

    @property
    def selection_score(self) -> float:
        """What picks the best checkpoint: the ``select_by`` metric (NaN where it was not
        measured), else the first STS file's Spearman, else the first retrieval set's nDCG@10."""
        if self.select_by is not None:
            return self._set_metrics().get(self.select_by, math.nan)
        if self.scores:
            return self.scores[0].spearman
        return self.retrieval[0].ndcg_at_10

    def _set_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for score in [*self.scores, *self.retrieval]:
            out.update(score.metrics())
        return out

    def metrics(self) -> dict[str, float]:
        out = self._set_metrics()
        out["eval_score"] = self.selection_score
        return out

    def describe(self) -> str:
        """The ``[eval]`` line's scores: the first STS file's, then each retrieval set's nDCG@10."""
        parts = []
        if self.scores:
            first = self.scores[0]
            parts.append(
                f"{first.name} spearman {first.spearman:.2f}, "
                f"alignment {first.alignment:.3f}, uniformity {first.uniformity:.3f}"
            )
        parts += [f"{r.name} ndcg@10 {r.ndcg_at_10:.2f}, mrr@10 {r.mrr_at_10:.2f}" for r in self.retrieval]
        return "; ".join(parts)


def selectable_metrics(sts_names: list[str], retrieval_names: list[str]) -> list[str]:
    """Every metric ``eval.select_by`` can name for these STS files and retrieval sets."""
    return [f"sts_{metric_key(n)}_{m}" for n in sts_names for m in SELECTABLE_METRICS["sts"]] + [
        f"retrieval_{metric_key(n)}_{m}" for n in retrieval_names for m in SELECTABLE_METRICS["retrieval"]
    ]


def selected_metric(section: EvalSection, sts_names: list[str], retrieval_names: list[str]) -> str | None:
    """The metric that picks the exported model, by name: ``eval.select_by``, else the first
    STS file's Spearman, else the first retrieval set's nDCG@10 (what
    :attr:`EvalOutcome.selection_score` reads); None when nothing is evaluated."""
    if section.select_by is not None:
        return section.select_by
    if sts_names:
        return f"sts_{metric_key(sts_names[0])}_spearman"
    if retrieval_names:
        return f"retrieval_{metric_key(retrieval_names[0])}_ndcg_at_10"
    return None


def check_eval_sets(section: EvalSection, sts_names: list[str], retrieval_names: list[str]) -> None:
    """The eval section against the sets the job really evaluates (names known once read).

    Raises:
        ConfigError: ``eval.select_by`` names no metric of these sets, or ``eval.patience``
            is set and nothing is evaluated.
    """
    if section.patience and not sts_names and not retrieval_names:
        raise ConfigError(
            f"eval.patience={section.patience} needs an evaluation to stop on: set eval.sts or eval.retrieval"
        )
    if section.select_by is None:
        return
    choices = selectable_metrics(sts_names, retrieval_names)
    if section.select_by not in choices:
        raise ConfigError(
            f"eval.select_by: no metric {section.select_by!r} among the evaluated sets "
            f"(one of {', '.join(choices) or 'none: set eval.sts or eval.retrieval'})"
        )


def eval_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow names for :meth:`EvalOutcome.metrics`: the ``eval/`` chart section, e.g.
    ``eval/sts_stsb-dev_spearman``. The selection score is left out: it repeats the
    ``eval.select_by`` metric's series (the shipped model's is ``best/score``)."""
    return {
        f"eval/{key.removeprefix('eval_')}": value for key, value in metrics.items() if key != "eval_score"
    }


class TrainingEvaluator:
    """Evaluates the live model on the configured STS files and retrieval sets (all ranks must
    call :meth:`evaluate`)."""

    def __init__(
        self,
        section: EvalSection,
        eval_set: STSEvalSet | None,
        *,
        rank: int,
        world: int,
        device: torch.device,
        retrieval_set: RetrievalEvalSet | None = None,
    ):
        if eval_set is None and retrieval_set is None:
            raise ValueError("TrainingEvaluator needs an STS or a retrieval eval set")
        self.section = section
        self.eval_set = eval_set
        self.sts_corpus = eval_set.corpus() if eval_set is not None else None
        self.retrieval_set = retrieval_set
        self.retrieval_corpus = retrieval_set.corpus() if retrieval_set is not None else None
        self.rank, self.world, self.device = rank, world, device

    def evaluate(self, model: SentenceEncoder) -> EvalOutcome | None:
        """Score the model (in eval mode, no dropout); the outcome on rank 0, None elsewhere."""
        embeddings = retrieval_embeddings = None
        if self.eval_set is not None:
            rows = np.arange(self.eval_set.num_sentences)
            embeddings = sharded_encode(
                model, self.sts_corpus, rows, device=self.device, rank=self.rank, world=self.world
            )
        if self.retrieval_set is not None:
            rows = np.arange(self.retrieval_set.num_sentences)
            retrieval_embeddings = sharded_encode(
                model, self.retrieval_corpus, rows, device=self.device, rank=self.rank, world=self.world
            )
        if self.rank != 0:
            return None
        scores = []
        if self.eval_set is not None:
            assert embeddings is not None
            scores = score_embeddings(self.eval_set, embeddings)
        retrieval = []
        if self.retrieval_set is not None:
            assert retrieval_embeddings is not None
            retrieval = score_retrieval_embeddings(self.retrieval_set, retrieval_embeddings)
        return EvalOutcome(scores, retrieval, self.section.select_by)
