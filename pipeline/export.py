"""Choosing the checkpoint to ship, writing it out, and logging it to MLflow as the run's model.

The exported folder is the checkpoint's model folder as it is: Hugging Face weights and
tokenizer, the sentence-transformers module files, and the whitening layer when evaluation
fitted one. It loads with ``AutoModel``/``AutoTokenizer`` and with ``SentenceTransformer``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipeline.checkpoint import BestModel, best_model_folder
from pipeline.tracking import TrackedRun


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


def log_sentence_transformers_model(tracked: TrackedRun, export_dir: Path, register_as: str | None) -> str:
    """Log the folder with MLflow's sentence-transformers flavor as the run's model (and a new
    registry version under ``register_as``); returns the model URI."""
    import mlflow
    import mlflow.sentence_transformers
    from sentence_transformers import SentenceTransformer

    from pipeline.tracking import package_versions

    versions = package_versions()
    requirements = [f"{name}=={versions[name]}" for name in ("sentence-transformers", "transformers", "torch")
                    if name in versions]  # fmt: skip
    model = SentenceTransformer(str(export_dir), device="cpu")
    mlflow.set_tracking_uri(tracked.tracking_uri)
    # The fluent API needs an active run; this resumes ours and, on leaving, marks it FINISHED,
    # which the job does next anyway.
    with mlflow.start_run(run_id=tracked.run_id):
        info = mlflow.sentence_transformers.log_model(
            model,
            name="model",
            pip_requirements=requirements,
            registered_model_name=register_as,
            await_registration_for=0,
        )
    return info.model_uri
