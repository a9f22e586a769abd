"""The shipped model's scores under stable names: the metrics and tags that let a reviewer sort
and compare runs on what they ship, and the evaluation the logged model is linked to."""

from __future__ import annotations

from pipeline.evaluation.in_training import eval_metric_names


def exported_eval_metrics(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, float]:
    """The exported model's own evaluation under the names the run logged it with
    (:func:`~pipeline.evaluation.in_training.eval_metric_names`: ``eval/sts_stsb-dev_spearman``
    ...); empty when no evaluation ran at ``exported_step``."""
    evaluated = _evaluation_at(eval_history, exported_step)
    if evaluated is None:
        return {}
    return eval_metric_names({k: v for k, v in evaluated.items() if k not in ("epoch", "step")})


def best_model_metrics(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, float]:
    """The shipped model's selection score as a metric to sort and filter runs on:
    ``best/score`` (its ``eval.select_by`` score), when it was evaluated. One metric, not one
    per score: its other scores are the logged model's metrics and the run's ``best.*`` tags
    (:func:`best_model_tags`); its step and epoch are the ``simcse.exported_step`` and
    ``simcse.exported_epoch`` tags."""
    evaluated = _evaluation_at(eval_history, exported_step)
    if evaluated is None or "eval_score" not in evaluated:
        return {}
    return {"best/score": evaluated["eval_score"]}


def _evaluation_at(eval_history: list[dict[str, float]], step: int) -> dict[str, float] | None:
    return next((row for row in eval_history if int(row["step"]) == step), None)


def best_model_tags(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, str]:
    """Every score of the shipped model as a run tag, for the runs table's columns:
    ``best.sts_stsb-dev_spearman`` = ``"84.12"`` ... (4 significant digits); empty when no
    evaluation ran at ``exported_step``."""
    evaluated = exported_eval_metrics(eval_history, exported_step)
    return {"best." + key.removeprefix("eval/"): f"{value:.4g}" for key, value in evaluated.items()}
