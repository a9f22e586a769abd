"""Logging the exported model folder to MLflow as the run's model (and registering it).

The folder comes from :func:`pipeline.training.checkpoint.export_checkpoint_model`; its scores
from :mod:`pipeline.evaluation.exported`. Tracking takes both as arguments: it knows MLflow,
not checkpoints or evaluators.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.entities import LoggedModelOutput, Metric

from pipeline.tracking.context import package_versions
from pipeline.tracking.run import TrackedRun


def log_sentence_transformers_model(
    tracked: TrackedRun,
    export_dir: Path,
    *,
    register_as: str | None,
    step: int,
    linked_metrics: dict[str, int],
    description: str,
    name: str = "model",
    tags: dict[str, str] | None = None,
) -> tuple[str, str | None]:
    """Log the folder with MLflow's sentence-transformers flavor as the run's model ``name``,
    output at training step ``step`` (the step it was exported from), with ``description``
    (the UI's Description column) and ``tags`` (what it was trained on), and (under
    ``register_as``) as a new registry version with the same description and tags beside its
    ``best/`` scores.

    The run's value of each ``linked_metrics`` key at the step it maps to (the evaluation's
    at ``step``, a summary's at 0) becomes the model's metric. MLflow's
    own ``log_model(step=...)`` would link every metric logged at that step number, system
    metrics included (whose steps count samples, not training steps), so the model is
    created first and linked here to exactly these.

    Returns the model URI and the registered version (None when not registered).
    """
    # Deferred: sentence-transformers and MLflow's flavor for it take seconds to import and
    # are needed once, at the end of a job whose driver imports this module at its start.
    import mlflow.sentence_transformers
    from sentence_transformers import SentenceTransformer

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
        for key, at_step in linked_metrics.items()
        for m in client.get_metric_history(run_id, key)
        if m.step == at_step and m.model_id is None
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
            if m.key.startswith(("best/", "eval/")):
                client.set_model_version_tag(register_as, version, m.key, f"{m.value:g}")
        client.set_model_version_tag(register_as, version, "source_run", run_id)
    return info.model_uri, version
