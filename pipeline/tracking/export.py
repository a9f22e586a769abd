"""Choosing the checkpoint to ship, writing it out, and logging it to MLflow as the run's model.

The exported folder is the checkpoint's model folder as it is: Hugging Face weights and
tokenizer, the sentence-transformers module files, and the whitening layer when evaluation
fitted one. It loads with ``AutoModel``/``AutoTokenizer`` and with ``SentenceTransformer``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipeline.tracking.run import TrackedRun
from pipeline.training.checkpoint import best_model_folder
from pipeline.training.state import BestModel


def export_checkpoint_model(checkpoint: Any, export_dir: Path) -> tuple[Path, BestModel | None]:
    """Copy the model to ship out of the run's final checkpoint into ``export_dir`` (replacing
    an earlier export): the best evaluated model it carries, else its current model.

    Returns the folder and the evaluation that chose it (None without evaluation).
    """
    if export_dir.exists():
        shutil.rmtree(export_dir)
    with checkpoint.as_directory() as ckpt_dir:
        folder, best = best_model_folder(Path(ckpt_dir))
        shutil.copytree(folder, export_dir)
    return export_dir, best


def exported_eval_metrics(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, float]:
    """The exported model's own evaluation under the names the run logged it with
    (:func:`~pipeline.evaluation.in_training.eval_metric_names`: ``eval/sts_stsb-dev_spearman``,
    ``eval/score`` ...); empty when no evaluation ran at ``exported_step``."""
    from pipeline.evaluation.in_training import eval_metric_names

    evaluated = next((row for row in eval_history if int(row["step"]) == exported_step), None)
    if evaluated is None:
        return {}
    return eval_metric_names({k: v for k, v in evaluated.items() if k not in ("epoch", "step")})


def best_model_metrics(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, float]:
    """The shipped model's selection score and where it came from, as metrics to sort and
    filter runs on: ``best/step`` and, when it was evaluated, ``best/score`` (its
    ``eval.select_by`` score). Two single-point charts, not one per score: its other scores
    are the logged model's metrics and the run's ``best.*`` tags (:func:`best_model_tags`);
    the epoch is the ``simcse.exported_epoch`` tag."""
    out = {"best/step": float(exported_step)}
    evaluated = exported_eval_metrics(eval_history, exported_step)
    if "eval/score" in evaluated:
        out["best/score"] = evaluated["eval/score"]
    return out


def best_model_tags(eval_history: list[dict[str, float]], exported_step: int) -> dict[str, str]:
    """Every score of the shipped model as a run tag, for the runs table's columns:
    ``best.sts_stsb-dev_spearman`` = ``"84.12"`` ... (4 significant digits); empty when no
    evaluation ran at ``exported_step``."""
    evaluated = exported_eval_metrics(eval_history, exported_step)
    return {
        "best." + key.removeprefix("eval/"): f"{value:.4g}"
        for key, value in evaluated.items()
        if key not in ("eval/score", "eval/seconds")
    }


def log_sentence_transformers_model(
    tracked: TrackedRun,
    export_dir: Path,
    register_as: str | None,
    step: int,
    linked_metrics: list[str],
    description: str,
    name: str = "model",
    tags: dict[str, str] | None = None,
) -> tuple[str, str | None]:
    """Log the folder with MLflow's sentence-transformers flavor as the run's model ``name``,
    output at training step ``step`` (the step it was exported from), with ``description``
    (the UI's Description column) and ``tags`` (what it was trained on), and (under
    ``register_as``) as a new registry version with the same description and tags beside its
    ``best/`` scores.

    The run's values of ``linked_metrics`` at ``step`` become the model's metrics. MLflow's
    own ``log_model(step=...)`` would link every metric logged at that step number, system
    metrics included (whose steps count samples, not training steps), so the model is
    created first and linked here to exactly these.

    Returns the model URI and the registered version (None when not registered).
    """
    import mlflow
    import mlflow.sentence_transformers
    from mlflow.entities import LoggedModelOutput, Metric
    from sentence_transformers import SentenceTransformer

    from pipeline.tracking.context import package_versions

    versions = package_versions()
    requirements = [f"{name}=={versions[name]}" for name in ("sentence-transformers", "transformers", "torch")
                    if name in versions]  # fmt: skip
    client, run_id = tracked.client, tracked.run_id
    model_tags = {"mlflow.note.content": description, **(tags or {})}
    logged = client.create_logged_model(
        tracked.experiment_id,
        name=name,
        source_run_id=run_id,
        params=client.get_run(run_id).data.params,
        tags=model_tags,
    )
    model = SentenceTransformer(str(export_dir), device="cpu")
    mlflow.set_tracking_uri(tracked.tracking_uri)
    # No active run: with one, MLflow would link the run's metrics at step 0 to the model.
    info = mlflow.sentence_transformers.log_model(
        model,
        model_id=logged.model_id,
        pip_requirements=requirements,
        registered_model_name=register_as,
        await_registration_for=0,
    )
    client.log_outputs(run_id, models=[LoggedModelOutput(logged.model_id, step=step)])
    linked = [
        Metric(m.key, m.value, m.timestamp, m.step, model_id=logged.model_id, run_id=run_id)
        for key in linked_metrics
        for m in client.get_metric_history(run_id, key)
        if m.step == step and m.model_id is None
    ]
    if linked:
        client.log_batch(run_id, metrics=linked)
    version = None
    if register_as is not None:
        version = str(info.registered_model_version)
        client.update_model_version(register_as, version, description=description)
        for key, value in (tags or {}).items():
            client.set_model_version_tag(register_as, version, key, value)
        for m in linked:  # its scores, findable in the registry without opening the run
            if m.key.startswith(("best/", "eval/")) and m.key != "eval/seconds":
                client.set_model_version_tag(register_as, version, m.key, f"{m.value:g}")
        client.set_model_version_tag(register_as, version, "source_run", run_id)
    return info.model_uri, version
