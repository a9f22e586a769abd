"""What the miner is configured with besides its inputs: one :class:`MinerSettings`, built
from the run config once by the driver and handed to the miner actor.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.model.teacher import TeacherSettings

if TYPE_CHECKING:
    from pipeline.config.schema import Config


@dataclass(frozen=True)
class MinerSettings:
    """Everything the miner is configured with besides its inputs (corpus, model, triplets)."""

    pooler: str
    """``model.pooler``."""
    batch_size: int
    """``train.batch_size``: the global batch the plan is cut into."""
    seed: int
    """``run.seed``; each refresh searches and plans with ``seed + version``."""
    search: SearchSettings = field(default_factory=SearchSettings)
    """``mining.top_k``, the index and the device."""
    filters: NegativeFilters = field(default_factory=NegativeFilters)
    batch_sampler: str = "random"
    """Corpus task: how a refreshed epoch is grouped into batches (``mining.batch_sampler``,
    a sampler of :mod:`pipeline.batching.registry`)."""
    partition_rows: int | None = None
    """Corpus task: most rows planned at once (:mod:`~pipeline.mining.corpus_partitions`);
    None: :func:`~pipeline.mining.corpus_partitions.rows_per_partition` of ``top_k``."""
    random_negatives: int = 0
    """Pairs task: random pool rows added per anchor beside the mined negatives."""
    teacher: TeacherSettings | None = None
    """Pairs task: the teacher that scores each row's positive and negatives
    (``mining.teacher``); None: none."""
    denoise_margin: float | None = None
    """``mining.teacher.denoise_margin``: the teacher drops a negative it scores at or above
    the positive's score less this; None: it does not denoise."""
    keep_negatives: int | None = None
    """Mined negatives a row keeps after the teacher's denoising (``Config.negatives_mined``),
    of the ``filters.num_negatives`` the filters kept; None: all of them."""
    shards: int = 1
    """``mining.shards`` as the job resolved it: 1 encodes and searches in the miner itself; N
    over N shard actors (:class:`~pipeline.mining.miner_shards.MinerShards`, each with
    ``num_cpus`` and ``num_gpus``)."""
    num_cpus: float = 1.0
    """The miner actor's own CPUs, and each shard's (``mining.num_cpus``)."""
    num_gpus: float = 0.0
    """Each shard's GPUs (``mining.num_gpus``), where it encodes, searches and scores with the
    teacher; with ``shards: 1`` the miner actor's own (:attr:`miner_num_gpus`)."""
    label_selector: dict[str, str] = field(default_factory=dict)
    """Ray node labels the miner and its shards must run on (``mining.label_selector``)."""
    max_restarts: int = 0
    """Times Ray restarts a dead miner actor (``train.max_failures``; -1: no limit)."""
    tracking_uri: str | None = None
    run_id: str | None = None
    """The MLflow run the miner logs its ``mining/`` metrics and histograms to; None: no logging."""
    tracking_relay: str | None = None
    """The name of the driver's :class:`~pipeline.tracking.relay.TrackingRelay` when the store
    is on its disk (the miner logs through it); None: it opens ``tracking_uri`` itself."""
    mined_dir: str | None = None
    """Where each refresh's plan or negatives column is written (``storage/run name/mined``:
    every node reads it), so that it reaches training as a URI; None: in the report."""

    @property
    def use_gpu(self) -> bool:
        return self.num_gpus > 0

    @property
    def miner_num_gpus(self) -> float:
        """The miner actor's own GPUs: none when shards encode and search (it plans only)."""
        return 0.0 if self.shards > 1 else self.num_gpus

    def reserved(self) -> tuple[float, float]:
        """CPUs and GPUs the miner and its shards reserve in all."""
        shards = self.shards if self.shards > 1 else 0
        return self.num_cpus * (1 + shards), self.miner_num_gpus + self.num_gpus * shards

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        tracking_relay: str | None = None,
        *,
        shards: int | None = None,
        mined_dir: str | None = None,
    ) -> MinerSettings:
        """The settings of the run config ``cfg``, logging to MLflow run ``run_id`` at
        ``tracking_uri`` (through ``tracking_relay`` when the driver started one), over
        ``shards`` (:func:`pipeline.runtime.cluster.miner_shards`: ``mining.shards`` resolved on
        the cluster; None: ``mining.shards``, 1 where it is null), writing what it mines to
        ``mined_dir``."""
        mining = cfg.mining
        return cls(
            pooler=cfg.model.pooler,
            batch_size=cfg.train.batch_size,
            seed=cfg.run.seed,
            search=SearchSettings.from_config(cfg),
            # sampling: random keeps the window's every survivor, nearest first; each epoch draws
            # from them (training.plan_source.epoch_negatives).
            # A denoising teacher gets the window's every survivor, and its drops are refilled
            # from the deeper ones.
            filters=dataclasses.replace(
                NegativeFilters.from_config(cfg),
                num_negatives=cfg.negatives_filtered,
                sampling="top" if cfg.negatives_filtered > mining.num_negatives else mining.sampling,
            ),
            teacher=teacher_settings(cfg),
            denoise_margin=mining.teacher.denoise_margin,
            keep_negatives=cfg.negatives_mined,
            batch_sampler=mining.batch_sampler,
            random_negatives=mining.random_negatives,
            shards=shards or mining.shards or 1,
            num_cpus=mining.num_cpus,
            num_gpus=mining.num_gpus,
            label_selector=dict(mining.label_selector),
            max_restarts=cfg.train.max_failures,
            tracking_uri=tracking_uri,
            run_id=run_id,
            tracking_relay=tracking_relay,
            mined_dir=mined_dir,
        )


def teacher_settings(cfg: Config) -> TeacherSettings | None:
    """``mining.teacher`` as the teacher reads it (its kind and pooling the folder's; texts cut
    at ``data.max_seq_len``, as many a forward pass as every encode on its device); None: no
    teacher."""
    model = cfg.mining.teacher.model
    if model is None:
        return None
    return TeacherSettings(model=model, max_seq_len=cfg.data.max_seq_len)
