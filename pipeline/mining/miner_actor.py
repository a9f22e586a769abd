"""The miner as a Ray actor: :class:`HardNegativeMinerActor`, which loads the plain
:class:`~pipeline.mining.miner.HardNegativeMiner` from the object refs every call brings, and
:func:`start_miner_actor`, which starts it with the settings' own resources.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from pipeline.core.seams import actor_runtime_env, hold_once
from pipeline.mining.miner import HardNegativeMiner, RefreshReport
from pipeline.mining.miner_settings import MinerSettings


class HardNegativeMinerActor:
    """:class:`HardNegativeMiner` as a Ray actor whose constructor takes only plain values.

    The corpus, the model and the triplets are object refs the driver holds for the job's
    life; every call brings them (``inputs``: a list, so that Ray hands them over unresolved)
    and the first call after a start or a restart loads the miner from them. A constructor
    that took them as arguments would make a restart depend on Ray keeping its own copy of the
    arguments, which it warns about at creation as an error-level line (ray-project/ray#53727).
    """

    def __init__(self, settings: MinerSettings):
        self.settings = settings
        self.miner: HardNegativeMiner | None = None

    def _loaded(self, inputs: list[Any]) -> HardNegativeMiner:
        if self.miner is None:
            corpus, model_ref, triplets_ref, texts, teacher_ref = inputs
            triplets = ray.get(triplets_ref) if triplets_ref is not None else None
            self.miner = HardNegativeMiner(
                corpus, model_ref, self.settings, triplets=triplets, texts=texts, teacher_blob=teacher_ref
            )
        return self.miner

    def ready(self, inputs: list[Any]) -> int:
        """This actor's process id, once the miner is loaded (see :meth:`HardNegativeMiner.ready`)."""
        hold_once("miner_start", 0)
        return self._loaded(inputs).ready()

    def refresh(
        self, inputs: list[Any], encoder_state: dict[str, torch.Tensor], version: int, step: int
    ) -> RefreshReport:
        """:meth:`HardNegativeMiner.refresh`, loading the miner first if this process has not."""
        return self._loaded(inputs).refresh(encoder_state, version, step)

    def wait_logged(self, timeout: float) -> bool:
        """:meth:`HardNegativeMiner.wait_logged` (nothing to wait for before the first load)."""
        return self.miner.wait_logged(timeout) if self.miner is not None else True


def start_miner_actor(settings: MinerSettings) -> Any:
    """Start :class:`HardNegativeMinerActor` with the settings' own resources; its calls take
    the list of object refs :func:`pipeline.training.contract.miner_inputs` makes.

    Returns:
        The actor handle. Ray restarts a dead actor up to ``settings.max_restarts`` times;
        calls in flight when it died fail rather than being retried, so the caller knows to
        submit the refresh again with newer weights (the new process loads on that call).
    """
    return ray.remote(HardNegativeMinerActor).options(**miner_actor_options(settings)).remote(settings)


def miner_actor_options(settings: MinerSettings) -> dict[str, Any]:
    """The miner actor's Ray options: its own CPUs and GPUs (Ray sets its
    ``CUDA_VISIBLE_DEVICES`` to those GPUs alone; none when shards encode), a node that
    ``mining.label_selector`` matches, and restarts up to ``train.max_failures``."""
    return {
        "num_cpus": settings.num_cpus,
        "num_gpus": settings.miner_num_gpus,
        "label_selector": settings.label_selector or None,
        "max_restarts": settings.max_restarts,
        "max_task_retries": 0,
        "runtime_env": actor_runtime_env() or None,
    }
