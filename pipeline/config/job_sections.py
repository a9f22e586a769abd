"""The sections about where and as what a job runs rather than what it trains: ``run`` (its
name, folders and seed), ``ray`` (the cluster) and ``tracking`` (MLflow)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.check import Check


@dataclass
class RunSection:
    name: str | None = None
    """Run name. A job started again with the same name resumes that run's latest checkpoint
    and continues its MLflow run. ``None`` generates a fresh name."""
    output_dir: str = "runs"
    """Local folder for the run's files: ``output_dir/name/model`` (the exported model), the
    initial model and a generated corpus."""
    storage_path: str | None = None
    """Where Ray Train keeps checkpoints (``storage_path/name``): a local folder or any pyarrow
    filesystem URI (``s3://...``, ``gs://...``). Must be shared storage on a multi-node
    cluster. ``None``: ``output_dir``."""
    seed: int = 42

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        valid = self.name is None or (bool(self.name) and all(c.isalnum() or c in "-_." for c in self.name))
        return [("run.name", valid, "may hold only letters, digits, '-', '_' and '.'")]


@dataclass
class RaySection:
    address: str | None = None
    """Cluster to join. ``None``: ``RAY_ADDRESS`` if set (as under ``ray job submit``), else start
    a local Ray."""
    num_cpus: float | None = None
    """Logical CPUs of a locally started Ray (``None``: the machine's count)."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`): none."""
        return []


@dataclass
class TrackingSection:
    uri: str | None = None
    """MLflow tracking URI. ``MLFLOW_TRACKING_URI`` wins; default: ``sqlite:///mlruns.db`` in the
    working directory with artifacts in ``./mlartifacts``."""
    experiment: str = "simcse"
    register_as: str | None = None
    """Register the exported model in the MLflow Model Registry under this name (a new version
    per run). ``None``: log it as the run's model only."""
    system_metrics: bool = True
    """Log MLflow's system metrics (``system/...``: CPU, memory, disk, network; GPU
    utilisation and memory where ``nvidia-ml-py`` is installed) from the driver's machine for
    the whole job and from every other node that runs training workers, so a reviewer sees
    whether the hardware was busy."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("tracking.experiment", bool(self.experiment.strip()), "must not be empty"),
            (
                "tracking.register_as",
                self.register_as is None or bool(self.register_as.strip()),
                "must not be empty",
            ),
        ]
