"""STS evaluation inside the train loop, sharded over the workers.

Every worker encodes its slice of the STS sentences (and of the whitening sample), the
slices are gathered to rank 0, and rank 0 scores them. Evaluation then costs each worker
1/world of the encoding instead of idling while rank 0 encodes everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.config.sections import EvalSection
from pipeline.evaluation.scoring import STSEvalSet, STSScore, score_embeddings
from pipeline.evaluation.whitening import Whitening, fit_whitening
from pipeline.model.encode import sharded_encode
from pipeline.model.encoder import SentenceEncoder


@dataclass
class EvalOutcome:
    """Rank 0's result of one evaluation."""

    scores: list[STSScore]
    whitening: Whitening | None

    @property
    def selection_score(self) -> float:
        """The first STS file's score (whitened when whitening is on): what picks the best checkpoint."""
        return self.scores[0].selection_score

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for score in self.scores:
            out.update(score.metrics())
        out["eval_score"] = self.selection_score
        return out


def eval_metric_names(metrics: dict[str, float]) -> dict[str, float]:
    """MLflow names for :meth:`EvalOutcome.metrics`: the ``eval/`` chart section, e.g.
    ``eval/sts_stsb-dev_spearman`` and ``eval/score``."""
    return {f"eval/{key.removeprefix('eval_')}": value for key, value in metrics.items()}


class TrainingEvaluator:
    """Evaluates the live model on the configured STS files (all ranks must call :meth:`evaluate`)."""

    def __init__(
        self,
        section: EvalSection,
        eval_set: STSEvalSet,
        train_corpus: Any,
        seed: int,
        rank: int,
        world: int,
        device: torch.device,
    ):
        self.section = section
        self.eval_set = eval_set
        self.sts_corpus = eval_set.corpus()
        self.train_corpus = train_corpus
        self.rank, self.world, self.device = rank, world, device
        self.whitening_rows: np.ndarray | None = None
        if section.whitening:
            n = len(train_corpus)
            take = min(section.whitening_rows, n)
            self.whitening_rows = np.sort(np.random.default_rng(seed).choice(n, take, replace=False))

    def evaluate(self, model: SentenceEncoder) -> EvalOutcome | None:
        """Score the model (in eval mode, no dropout); the outcome on rank 0, None elsewhere."""
        rows = np.arange(self.eval_set.num_sentences)
        embeddings = sharded_encode(
            model, self.sts_corpus, rows, self.section.batch_size, self.device, self.rank, self.world
        )
        whitening = None
        if self.whitening_rows is not None:
            corpus_embeddings = sharded_encode(
                model,
                self.train_corpus,
                self.whitening_rows,
                self.section.batch_size,
                self.device,
                self.rank,
                self.world,
            )
            if self.rank == 0:
                whitening = fit_whitening(corpus_embeddings, self.section.whitening_dim)
        if self.rank != 0:
            return None
        assert embeddings is not None
        scores = score_embeddings(self.eval_set, embeddings, self.section.positive_threshold, whitening)
        return EvalOutcome(scores, whitening)
