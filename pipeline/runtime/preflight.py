"""Checks of the environment a resolved config needs, run before Ray or MLflow start.

Each is cheap and each turns a failure that would otherwise come late (FAISS missing: after
a whole epoch, when the miner first searches) or never clearly (a CPU-only torch asked for
a GPU) into one line naming the key and what to install or change.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import ray
import torch

from pipeline.config.schema import Config
from pipeline.core.errors import ConfigError
from pipeline.runtime.cluster import cluster_address


def check_faiss(why: str) -> None:
    """FAISS is an extra (``[cpu]`` or ``[gpu]``), so a plain ``pip install -e .`` lacks it.

    Raises:
        ConfigError: naming ``why`` (the key that needs it) and the extras.
    """
    try:
        import faiss  # noqa: F401  (deferred: whether it imports is the check)
    except ImportError as exc:
        raise ConfigError(
            f"{why} needs FAISS, which is not installed ({exc}): pip install -e '.[cpu]' "
            "(or '.[gpu]' on a CUDA 12 machine)"
        ) from None


def check_cuda(cfg: Config) -> None:
    """A GPU asked for by a job that runs on this machine must be one torch can use.

    On a joined cluster (configured, or a Ray this process already joined) the workers run
    elsewhere; the cluster's resources are checked once Ray is up
    (:func:`pipeline.runtime.cluster.check_cluster_fits`).
    """
    wants = []
    if cfg.train.use_gpu:
        wants.append(f"train.gpus_per_worker={cfg.train.gpus_per_worker:g}")
    if cfg.runs_miner and cfg.mining.num_gpus > 0:
        wants.append(f"mining.num_gpus={cfg.mining.num_gpus:g}")
    joined = cluster_address(cfg) is not None or ray.is_initialized()
    if not wants or joined:
        return

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
        raise ConfigError(
            f"{' and '.join(wants)} but this machine has no usable CUDA device ({build}); "
            "run on a GPU machine or cluster, or set train.gpus_per_worker=0 and mining.num_gpus=0"
        )


def check_writable(key: str, path: str) -> None:
    """A local output folder can be created and written, tried without leaving anything
    behind: a file is made and removed in the folder, or in its nearest existing parent when
    the job would create it (URIs are checked by their writer).

    Raises:
        ConfigError: naming ``key`` and the OS error.
    """
    if "://" in path:
        return
    folder = Path(path).expanduser().resolve()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is not a folder")
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{key}: {path} is not writable ({exc.strerror or exc})") from None


def preflight_train(cfg: Config) -> None:
    """Everything the training job's config needs from this machine, before any compute."""
    if cfg.runs_miner:
        check_faiss(f"mining.refresh={cfg.refresh} (hard-negative mining)")
    check_cuda(cfg)
    check_writable("run.output_dir", cfg.run.output_dir)
    if cfg.run.storage_path:
        check_writable("run.storage_path", cfg.run.storage_path)


def preflight_mine(cfg: Config, output: str) -> None:
    """Everything the offline mining job needs from this machine, before any compute."""
    check_faiss("jobs/mine.py")
    check_writable("--output", os.path.dirname(os.path.abspath(output)))
