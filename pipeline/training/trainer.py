"""The Ray Train ``TorchTrainer`` with resources, failure handling and checkpoint retention from config."""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs
import ray.train
from ray.train import ControllerError, UserCallback
from ray.train.torch import TorchConfig, TorchTrainer

from pipeline.config.schema import Config
from pipeline.core.errors import describe_error, is_deterministic, is_process_death, root_cause
from pipeline.core.seams import actor_runtime_env
from pipeline.data.formats import filesystem_of
from pipeline.training.worker import LOOP_CONFIG_KEY, train_loop_per_worker


def worker_failure_reporter(max_failures: int) -> Any:
    """A Ray Train callback that prints one line per failed worker-group attempt, and ends
    the run at once when the failure would only repeat.

    Ray Train's own report of a failure is a traceback (hidden unless the job runs with
    ``--debug``, see :func:`build_trainer`);
    this line says which rank failed, why, and whether the group is restarted. Ray Train
    retries every worker error up to ``train.max_failures``; an error that
    :func:`pipeline.core.errors.is_deterministic` (a missing package, bad input, out of memory
    on a batch) would come back from the same checkpoint each time, so the callback raises
    Ray Train's ``ControllerError``, which its failure policy never retries. A dead worker
    is always retried. The callback runs in the Train controller, whose prints reach the
    driver's console."""

    class WorkerFailureReporter(UserCallback):
        def __init__(self) -> None:
            self.failures = 0

        def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
            self.failures += 1
            limit = "unlimited" if max_failures < 0 else str(max_failures)
            causes = {rank: root_cause(exc) for rank, exc in worker_exceptions.items()}
            a_worker_died = any(is_process_death(c) for c in causes.values())
            repeats = not a_worker_died and any(is_deterministic(c) for c in causes.values())
            retry = not repeats and (max_failures < 0 or self.failures <= max_failures)
            if repeats:
                decision = "not retried: it fails the same way on every restart)"
            elif retry:
                decision = "restarting the workers from the latest checkpoint)"
            else:
                decision = "giving up)"
            for rank, exc in sorted(worker_exceptions.items()):
                print(
                    f"[train] worker rank {rank} failed: {describe_error(exc)} (failure {self.failures}, "
                    f"train.max_failures={limit}; " + decision,
                    flush=True,
                )
            if repeats:
                first = next(rank for rank in sorted(causes) if is_deterministic(causes[rank]))
                raise ControllerError(causes[first])

    return WorkerFailureReporter()


# Ray Train (v2) resumes a run name whose storage folder holds this file, the list of the
# checkpoints its run reported (``CHECKPOINT_MANAGER_SNAPSHOT_FILENAME`` in Ray's internals).
RESUME_SNAPSHOT = "checkpoint_manager_snapshot.json"


def resumable_checkpoints(storage_path: str, run_name: str) -> str | None:
    """The storage folder (``storage_path/run_name``, local or a URI) that a trainer named
    ``run_name`` would resume from, because an earlier run of that name reported checkpoints
    there; None where it starts from scratch."""
    filesystem, root = filesystem_of(storage_path)
    snapshot = f"{root.rstrip('/')}/{run_name}/{RESUME_SNAPSHOT}"
    if filesystem.get_file_info(snapshot).type == pafs.FileType.NotFound:
        return None
    return f"{storage_path.rstrip('/')}/{run_name}"


def scaling_config(cfg: Config) -> ray.train.ScalingConfig:
    """Where the train workers run and what each reserves: ``train.num_workers`` workers of
    ``train.cpus_per_worker`` CPUs and ``train.gpus_per_worker`` GPUs (Ray shows each worker
    the GPUs of the workers on its node, and it trains on its own), on nodes that
    ``train.label_selector`` matches."""
    resources = {"CPU": cfg.train.cpus_per_worker}
    if cfg.train.use_gpu:
        resources["GPU"] = cfg.train.gpus_per_worker
    return ray.train.ScalingConfig(
        num_workers=cfg.train.num_workers,
        use_gpu=cfg.train.use_gpu,
        resources_per_worker=resources,
        label_selector=cfg.train.label_selector or None,
    )


def build_trainer(
    cfg: Config, loop_config_ref: Any, storage_path: str, run_name: str, debug: bool = False
) -> Any:
    """A ``TorchTrainer`` over :func:`train_loop_per_worker` with resources, failure handling
    and checkpoint retention from config. ``loop_config_ref`` is the object ref of the
    :class:`~pipeline.training.contract.LoopConfig` (``ray.put``): Ray Train's controller
    unpickles its config, and the LoopConfig's classes (and the miner's handle) would import
    torch, transformers and MLflow there, about 2.5 s of CPU per job start for nothing.

    Ray Train's own console logs are at ``CRITICAL`` (its failure reports carry full
    tracebacks; :func:`worker_failure_reporter` prints one line each instead), at ``INFO``
    with ``debug`` (the job's ``--debug``). Its log files in the Ray session's
    ``logs/train`` keep every level either way."""
    # Read by Ray Train's controller (it propagates this variable): each start or restart of
    # the worker group waits this long for resources, and a timeout is not retried, so a
    # group that cannot be placed ends the job instead of waiting forever.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = f"{cfg.train.placement_timeout_s:g}"
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={LOOP_CONFIG_KEY: loop_config_ref},
        scaling_config=scaling_config(cfg),
        torch_config=TorchConfig(
            backend=cfg.train.backend,
            # Ranks other than 0 wait in a collective while rank 0 waits on the miner.
            timeout_s=int(cfg.mining.timeout_s) + 600,
        ),
        run_config=ray.train.RunConfig(
            name=run_name,
            storage_path=storage_path,
            failure_config=ray.train.FailureConfig(
                max_failures=cfg.train.max_failures, controller_failure_limit=0
            ),
            # The newest checkpoints, by report order; the best evaluated model is inside each.
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            callbacks=[worker_failure_reporter(cfg.train.max_failures)],
            logging_config=ray.train.LoggingConfig(log_level="INFO" if debug else "CRITICAL"),
            worker_runtime_env=actor_runtime_env(),
        ),
    )
