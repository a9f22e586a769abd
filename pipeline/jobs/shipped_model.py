"""What a training job ships, after ``fit()``: the model exported from the final checkpoint and
summarised (:class:`~pipeline.jobs.summary.JobSummary`), then logged as the run's MLflow model
with its review artifacts, its ``best/`` scores, a name, a description and tags.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from pipeline.config.model_section import TINY_RANDOM_BERT
from pipeline.config.schema import Config
from pipeline.data.synthetic import GENERATED_STS_FILE, GENERATED_STS_NOTE
from pipeline.evaluation.exported import best_model_metrics, best_model_tags, exported_eval_metrics
from pipeline.jobs.summary import JobSummary
from pipeline.tracking.export import log_sentence_transformers_model
from pipeline.tracking.review import log_review
from pipeline.tracking.run import TrackedRun
from pipeline.training.checkpoint import export_checkpoint_model
from pipeline.training.contract import history_from_report


def export_and_summarise(
    cfg: Config, tracked: TrackedRun, result: Any, corpus: str, run_dir: Path
) -> JobSummary:
    """Export the model to ship from the final checkpoint to ``run_dir/model`` and summarise
    the run from the workers' last report."""

    assert cfg.run.name is not None
    metrics = result.metrics or {}
    history = history_from_report(metrics)
    export_dir, best = export_checkpoint_model(result.checkpoint, run_dir / "model")
    return JobSummary.from_training(
        cfg.run.name,
        tracked.run_id,
        tracked.tracking_uri,
        cfg.tracking.experiment,
        corpus=corpus,
        history=history,
        steps=int(metrics.get("step", 0)),
        best=best,
        model_dir=export_dir,
        base_model=base_model_name(cfg),
        data_name=Path(cfg.data.path).name if cfg.data.path else "generated data",
        eval_note=generated_sts_note(cfg, run_dir),
    )


def generated_sts_note(cfg: Config, run_dir: Path) -> str:
    """Where the reported STS file is the run's generated one, what it measures (else "")."""
    first = cfg.eval.sts[0] if cfg.eval.sts else None
    if first is None or Path(first).resolve() != (run_dir / GENERATED_STS_FILE).resolve():
        return ""
    return f"{Path(first).stem} is {GENERATED_STS_NOTE}"


def base_model_name(cfg: Config) -> str:
    """The fine-tuned model as a reviewer knows it: a hub name as is, a local folder by its
    name (the folder's path means nothing on another machine), or the tiny random BERT."""
    name = cfg.model.name_or_path
    if not name:
        return TINY_RANDOM_BERT
    return Path(name).name if Path(name).exists() else name


def log_exported_model(cfg: Config, tracked: TrackedRun, summary: JobSummary, run_dir: Path) -> JobSummary:
    """Log what a reviewer reads off the run (review artifacts, the exported step as tags,
    its ``best/`` scores) and the exported model as the run's MLflow model, linked to its
    own ``eval/`` and ``best/`` metrics and registered when ``tracking.register_as`` is set.

    Returns the summary with the model's URI and registered version.
    """

    epoch, step = summary.exported_epoch, summary.exported_step
    assert epoch is not None and step is not None and summary.model_dir is not None
    evaluations = summary.history.evaluations
    log_review(tracked, evaluations, epoch, summary.history.epoch_losses, run_dir)
    tracked.set_tags({"simcse.exported_epoch": f"{epoch:g}", "simcse.exported_step": step,
                      **best_model_tags(evaluations, step)})  # fmt: skip
    best_scores = best_model_metrics(evaluations, step)
    # At step 0, one point each: the run page draws them as bars, not as one-dot line charts.
    tracked.log_metrics(best_scores, step=0)
    model_uri, version = log_sentence_transformers_model(
        tracked,
        Path(summary.model_dir),
        register_as=cfg.tracking.register_as,
        step=step,
        linked_metrics={
            **dict.fromkeys(exported_eval_metrics(evaluations, step), step),
            **dict.fromkeys(best_scores, 0),
        },
        description=model_description(cfg, summary),
        name=model_name(summary.run_name),
        tags=model_tags(cfg, tracked),
    )
    registered = f"{cfg.tracking.register_as}/{version}" if version is not None else None
    return dataclasses.replace(summary, model_uri=model_uri, registered_as=registered)


def model_name(run_name: str) -> str:
    """The logged model's name: the run's, in the characters a model name may hold."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", run_name).strip("-") or "model"


def model_description(cfg: Config, summary: JobSummary) -> str:
    """What a registry user reads first: the base model, the data, the shipped score and what
    selected it."""
    base = base_model_name(cfg)
    selected = cfg.eval.select_by  # the job names it (the default too) before training
    scores = summary.scores()
    shipped = (
        f"Shipped the model of step {summary.exported_step} (selected by {selected}): {scores}."
        if scores
        else f"Shipped the last epoch's model (step {summary.exported_step}; no evaluation)."
    )
    return (
        f"SimCSE fine-tune of {base} on {summary.data_name} ({summary.corpus}), "
        f"{summary.epochs} epochs, run {summary.run_name!r} (MLflow run {summary.run_id}). {shipped}"
    )


def model_tags(cfg: Config, tracked: TrackedRun) -> dict[str, str]:
    """The logged model's (and registered version's) tags: the data it was trained on, by
    path and content digest, its base model and the run and commit it came from."""
    run_tags = tracked.client.get_run(tracked.run_id).data.tags
    tags = {
        "base_model": cfg.model.name_or_path or "tiny",
        "source_run": tracked.run_id,
        **{key: run_tags[key] for key in ("data.path", "data.digest", "data.rows") if key in run_tags},
    }
    if "mlflow.source.git.commit" in run_tags:
        tags["git_commit"] = run_tags["mlflow.source.git.commit"]
    return tags
