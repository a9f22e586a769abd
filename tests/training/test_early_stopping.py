"""Early stopping (``eval.patience``): the rule on a history and the config's checks. A real
job that stops where its own logged evaluations say it must and still exports the best model
is the third start of tests/test_failures.py's killed-job test (one job start for both)."""

from __future__ import annotations

import pytest

from pipeline.config.eval_section import EvalSection
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.evaluation.in_training import check_eval_sets
from pipeline.training.state import BestModel, TrainHistory


def _history(scores: list[float]) -> TrainHistory:
    """A history of one evaluation per epoch (epoch 0: the start), the best kept as the
    worker keeps it: strictly higher than every earlier one after the start."""
    history = TrainHistory()
    for epoch, score in enumerate(scores):
        history.evaluations.append({"epoch": float(epoch), "step": float(10 * epoch), "score": score})
        if epoch > 0 and (history.best is None or score > history.best.score):
            history.best = BestModel(score, float(epoch), 10 * epoch)
    return history


@pytest.mark.parametrize(
    ("scores", "since_best"),
    [
        ([50.0], 0),  # only the start: nothing to count
        ([90.0, 80.0], 0),  # the first trained evaluation is the best, however it compares to the start
        ([50.0, 60.0, 70.0], 0),
        ([50.0, 70.0, 60.0], 1),
        ([50.0, 70.0, 70.0, 69.0], 2),  # a tie does not beat the best
        ([50.0, 70.0, 60.0, 71.0, 65.0], 1),
    ],
)
def test_evaluations_since_best_counts_what_patience_counts(scores, since_best):
    assert _history(scores).evaluations_since_best() == since_best


def test_patience_is_checked_against_what_the_job_evaluates():
    with pytest.raises(
        ConfigError, match=r"^eval\.patience must be >= 0 \(0: no early stopping\) \(got -1\)$"
    ):
        load_config(None, ["eval.patience=-1"])
    with pytest.raises(ConfigError) as info:
        check_eval_sets(EvalSection(patience=2), [], [])
    assert str(info.value) == (
        "eval.patience=2 needs an evaluation to stop on: set eval.sts or eval.retrieval"
    )
    check_eval_sets(EvalSection(patience=2), ["stsb-dev"], [])  # an STS file is enough
