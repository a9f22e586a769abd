"""What a run was made from: the git commit, package versions and the datasets it read."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mlflow.entities import Dataset, DatasetInput, InputTag

from pipeline.tracking.run import TrackedRun

VERSIONED_PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "ray",
    "mlflow",
    "faiss-cpu",
    "faiss-gpu-cu12",
)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run's numbers depend on (absent ones left out)."""

    found = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        with suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


GIT_COMMIT_ENV = "SIMCSE_GIT_COMMIT"
REPO_ROOT = Path(__file__).resolve().parents[2]


def job_source(argv0: str | None = None) -> str:
    """What started the run, for MLflow's Source column: the job script relative to the
    repository (``jobs/train.py``), or the command's name when it is not a file inside it."""

    script = Path(argv0 if argv0 is not None else (sys.argv[0] or "python"))
    with suppress(ValueError, OSError):
        return script.resolve().relative_to(REPO_ROOT).as_posix()
    return script.name


def git_commit(start: Path | None = None) -> tuple[str | None, str]:
    """The commit the code runs from and where it came from: ``git rev-parse`` in the
    checkout, else the ``SIMCSE_GIT_COMMIT`` variable (a ``ray job submit`` working dir is
    uploaded without ``.git``, so the submitting side passes it in the job's runtime env).

    Returns ``(commit, source)``; ``commit`` is None when neither is there, and ``source``
    then says why.
    """

    where = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        )
        if out.stdout.strip():
            return out.stdout.strip(), "checkout"
    except (OSError, subprocess.SubprocessError):
        pass
    given = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if given:
        return given, GIT_COMMIT_ENV
    return None, f"not a git checkout and {GIT_COMMIT_ENV} is not set"


@dataclass(frozen=True)
class InputDataset:
    """A dataset a run read, as MLflow's Datasets column and dataset drawer show it."""

    source: str
    """The path or URI it was read from."""
    digest: str
    """A content fingerprint: the same data gives the same digest, whatever its file's name."""
    rows: int
    kind: str
    """What it is to the run: ``corpus``, ``pairs`` (training data), ``sts``, ``retrieval``."""
    columns: dict[str, str]
    """Its schema: column -> MLflow column type (``string``, ``long``, ``double``)."""
    context: str = "training"
    """MLflow's dataset context: ``training``, ``mining`` or ``eval``."""
    name: str | None = None
    """Shown name; None: the source's file name."""
    profile: dict[str, Any] = field(default_factory=dict)
    """Counts beyond ``rows`` (a retrieval set's documents)."""

    def entity(self) -> DatasetInput:
        schema = {
            "mlflow_colspec": [{"type": t, "name": n, "required": True} for n, t in self.columns.items()]
        }
        dataset = Dataset(
            name=self.name or Path(self.source).name or self.source,
            digest=self.digest,
            source_type="uri" if "://" in self.source else "local",
            source=json.dumps({"uri": self.source}),
            schema=json.dumps(schema),
            profile=json.dumps({"num_rows": self.rows, "kind": self.kind, **self.profile}),
        )
        return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", self.context)])


def log_datasets(tracked: TrackedRun, datasets: list[InputDataset]) -> None:
    """Log ``datasets`` as the run's dataset inputs (the UI's Datasets column and drawer)."""
    if datasets:
        tracked.client.log_inputs(tracked.run_id, datasets=[d.entity() for d in datasets])


def log_run_context(tracked: TrackedRun, dataset: InputDataset) -> str | None:
    """The input ``dataset`` (its fingerprint also as tags), the git commit and package versions.

    Returns a one-line note when no commit could be recorded (None when it was)."""

    log_datasets(tracked, [dataset])
    tags: dict[str, Any] = {
        "data.path": dataset.source,
        "data.rows": dataset.rows,
        "data.digest": dataset.digest,
    }
    # The runs table's Source column reads these two (and shows the commit beside them).
    tags["mlflow.source.name"] = job_source()
    tags["mlflow.source.type"] = "JOB"
    commit, origin = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["simcse.git_commit_from"] = origin
    tags.update({f"versions.{name}": value for name, value in package_versions().items()})
    tracked.set_tags(tags)
    if commit:
        return None
    return f"no git commit recorded ({origin}; see docs/operations.md, 'Jobs sent with ray job submit')"
