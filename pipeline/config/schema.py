"""The whole run configuration (:class:`Config`) and its validation, with errors naming the dotted key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.config.data_section import DataSection
from pipeline.config.eval_section import EvalSection
from pipeline.config.job_sections import RaySection, RunSection, TrackingSection
from pipeline.config.mining_section import MiningSection
from pipeline.config.model_section import ModelSection
from pipeline.config.train_section import CheckpointSection, TrainSection
from pipeline.core.errors import ConfigError

_REMOVED_DEBIAS = (
    "in-batch debiasing was removed (it never beat random batches by more than the seed spread, "
    "docs/results.md); delete the key"
)
_REMOVED_SAMPLERS = (
    "the rwr, clusters and mixed samplers were removed (none beat random batches by more than the "
    "seed spread, docs/results.md); delete the key"
)
_REMOVED_INDEX = (
    "the corpus size and the search device decide the index settings (pipeline.mining.index, "
    "measured in docs/benchmarks.md); keep mining.index and delete the key"
)
_REMOVED_ENCODE_BATCH = "the device decides it (64 sentences on a CPU, 1024 on a GPU); delete the key"
_REMOVED_WHITENING = (
    "training fits and exports no whitening (it cost a trained model 1-2 STS points, docs/results.md); "
    "delete the key, and whiten post hoc with jobs/evaluate.py --whiten-on"
)
REMOVED_KEYS = {
    "mining.negative_mode": "write `task: pairs` at the top of the config for triplet, "
    "`task: corpus` (the default) for neighbourhood",
    "mining.debias": _REMOVED_DEBIAS,
    "mining.debias_threshold": _REMOVED_DEBIAS,
    "mining.debias_weight": _REMOVED_DEBIAS,
    "mining.restart_probability": _REMOVED_SAMPLERS,
    "mining.num_clusters": _REMOVED_SAMPLERS,
    "mining.clusters_per_batch": _REMOVED_SAMPLERS,
    "mining.mixed_share": _REMOVED_SAMPLERS,
    "mining.mixed_group_size": _REMOVED_SAMPLERS,
    "mining.encode_actors": "the re-encode fans out over mining.shards, each shard encoding its "
    "range of the corpus and indexing it; delete the key",
    "train.use_gpu": "workers train on GPUs when train.gpus_per_worker > 0 (default 0: CPUs); delete the key",
    "train.peak_tflops": "train/mfu uses the datasheet peak of an H100/H200, none elsewhere; delete the key",
    "train.compile_mode": "write the mode as train.compile (off, default, reduce-overhead, max-autotune, "
    "max-autotune-no-cudagraphs)",
    "train.length_group_batches": "train.group_by_length groups 50 batches (Hugging Face's megabatch); delete the key",
    # The loader stops at the first unknown level, so model.tiny.* all end here.
    "model.tiny": "the tiny BERT has one fixed shape (pipeline/model/tiny.py); for another, name a "
    "model folder in model.name_or_path",
    "mining.enabled": "write `mining.refresh: never` for no mining; delete `enabled: true`",
    "mining.mode": "write `mining.refresh: every_epoch_async` for async refreshes (sync is `every_epoch`)",
    "mining.flat_max_rows": _REMOVED_INDEX,
    "mining.nlist": _REMOVED_INDEX,
    "mining.nprobe": _REMOVED_INDEX,
    "mining.pq_m": _REMOVED_INDEX,
    "mining.encode_batch_size": _REMOVED_ENCODE_BATCH,
    "eval.batch_size": _REMOVED_ENCODE_BATCH,
    "mining.encode_num_cpus": "each miner shard reserves mining.num_cpus, as the miner; delete the key",
    "mining.encode_num_gpus": "each miner shard reserves mining.num_gpus, as the miner; delete the key",
    "mining.start_timeout_s": "the miner's start waits train.placement_timeout_s; delete the key",
    "mining.max_restarts": "the miner is restarted up to train.max_failures times; delete the key",
    "ray.progress_bars": "Ray Data's progress bars are on with the job's --debug flag, off without; delete the key",
    "ray.train_log_level": "Ray Train's console logs are CRITICAL, INFO with the job's --debug flag; delete the key",
    "ray.dashboard_host": "a locally started Ray's dashboard listens on 127.0.0.1 only; to serve it on "
    "the network start Ray yourself (ray start --head --dashboard-host ...) and set ray.address to it",
    "ray.connect_timeout_s": "the job waits a fixed 30 s for the cluster at ray.address to answer; delete the key",
    "tracking.connect_timeout_s": "the job waits a fixed 15 s for the tracking server at start; delete the key",
    "tracking.flush_every_s": "metrics are sent every train.log_every steps and at least every 5 s; delete the key",
    "tracking.drain_timeout_s": "unsent metrics are retried for a fixed 300 s after training; delete the key",
    "tracking.system_metrics_interval_s": "system metrics are sampled every 10 s; delete the key",
    "data.tokenize_batch_size": "tokenization batches are a fixed 1024 rows; delete the key",
    "data.tokenize_actors": "the tokenizer pool grows to what the cluster's CPUs hold at "
    "data.tokenize_num_cpus each; delete the key",
    "data.generated.group_size": "generated paraphrase groups are 4 sentences; set the size with "
    "data.generated.num_groups",
    "data.generated.seed": "the generated corpus is fixed (seed 0); delete the key",
    "data.pool_text_column": "a csv/tsv/jsonl/parquet pool's texts are data.text_column; write the "
    "column there",
    "eval.format": "STS files are told apart by name and first line; delete the key",
    "eval.whitening": _REMOVED_WHITENING,
    "eval.whitening_dim": _REMOVED_WHITENING + " --whitening-dim",
    "eval.whitening_rows": _REMOVED_WHITENING + " --whitening-rows",
    "eval.positive_threshold": "a pair is a positive from 0.8 x its file's gold scale (4 on 0-5); "
    "delete the key",
}
"""Keys an older config may still carry, and what to write instead (one line each)."""

TASK_KEYS: dict[str, tuple[str, ...]] = {
    "pairs": (
        "data.anchor_column", "data.positive_column", "data.negative_column", "data.label_column",
        "data.given_negatives", "mining.random_negatives", "train.hard_negative_weight",
        "mining.teacher.model", "mining.teacher.denoise_margin", "mining.teacher.temperature",
        "train.distill_weight", "train.hardness_strength",
    ),
    "corpus": ("mining.batch_sampler", "train.mlm_weight"),
}  # fmt: skip
"""The keys only one task reads. Every other key means something in both tasks; one of these
set in the other task's config is an error, and the run's params leave them out there."""


@dataclass
class Config:
    task: Literal["corpus", "pairs"] = "corpus"
    """``corpus``: unsupervised SimCSE, one text a row (``data.text_column``); two dropout views
    of a row are its positive pair, the batch's other rows its negatives; a refresh regroups
    the rows into batches (``mining.batch_sampler``). ``pairs``: (anchor, positive[,
    negatives]) rows (retrieval, supervised SimCSE); each anchor's hard negatives are mined
    before epoch 1 (and refreshed by ``mining.refresh``) and travel beside it. The task picks
    the reader, the step, the loss's inputs and the input checks."""
    run: RunSection = field(default_factory=RunSection)
    ray: RaySection = field(default_factory=RaySection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    mining: MiningSection = field(default_factory=MiningSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)

    @property
    def pairs(self) -> bool:
        """``task: pairs``."""
        return self.task == "pairs"

    @property
    def refresh(self) -> str:
        """``mining.refresh`` as resolved for the task (see that key): as set, else ``once``
        for pairs, ``every_epoch`` for a corpus in ``knn`` batches and ``never`` for a corpus
        in random batches."""
        if self.mining.refresh is not None:
            return self.mining.refresh
        if self.pairs:
            return "once"
        return "every_epoch" if self.mining.batch_sampler != "random" else "never"

    @property
    def mines(self) -> bool:
        """Whether the run mines at all (:attr:`refresh` is not ``never``)."""
        return self.refresh != "never"

    @property
    def refreshes_at_boundaries(self) -> bool:
        """Whether epoch boundaries ask the miner for a plan from the newest weights."""
        return self.refresh in ("every_epoch", "every_epoch_async")

    @property
    def refresh_mode(self) -> Literal["sync", "async"]:
        """``async`` when a boundary's refresh runs while training goes on, else ``sync``."""
        return "async" if self.refresh == "every_epoch_async" else "sync"

    @property
    def mines_before_training(self) -> bool:
        """Pairs mine once with the starting model before epoch 1 (static negatives)."""
        return self.pairs and self.mines

    @property
    def runs_miner(self) -> bool:
        """Whether the run needs the miner actor (and FAISS)."""
        return self.mines_before_training or (self.refreshes_at_boundaries and self.train.epochs > 1)

    def groups_by_length(self, *, given_negatives: bool) -> bool:
        """``train.group_by_length`` as resolved (see that key): as set, else on exactly for
        pairs rows that carry no hard negative: no mining, and no row with a given negative
        (``given_negatives``: whether any row of the data has one)."""
        if self.train.group_by_length is not None:
            return self.train.group_by_length
        return self.pairs and not self.mines and not given_negatives

    @property
    def range_min(self) -> int:
        """``mining.range_min`` as resolved for the task (see that key)."""
        if self.mining.range_min is not None:
            return self.mining.range_min
        return 0 if self.pairs else 10

    @property
    def negatives_mined(self) -> int:
        """Negatives a pairs refresh keeps per anchor, of which each epoch trains with
        ``mining.num_negatives``: with ``mining.sampling: random`` every survivor of the rank
        window (``range_max`` or ``top_k``, less ``range_min``), drawn from anew each epoch;
        with ``top``, ``num_negatives`` (the same ones every epoch)."""
        mining = self.mining
        if not self.pairs or mining.sampling != "random":
            return mining.num_negatives
        return max(mining.num_negatives, self.rank_window)

    @property
    def rank_window(self) -> int:
        """Candidates a pairs anchor's rank window spans: ``range_max`` (else ``top_k``) less
        ``range_min``."""
        return (self.mining.range_max or self.mining.top_k) - self.range_min

    @property
    def negatives_filtered(self) -> int:
        """Negatives the filters keep per anchor before the teacher's denoising: every survivor
        of the rank window where the teacher denoises (a dropped one is refilled from deeper
        ranks; :attr:`negatives_mined` are kept after it), else :attr:`negatives_mined`."""
        if self.pairs and self.mining.teacher.denoise_margin is not None:
            return max(self.negatives_mined, self.rank_window)
        return self.negatives_mined

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted-key view of the whole config (for MLflow params)."""
        return flatten(self.to_dict())

    def validate(self) -> Config:
        """Check every key's value, then the rules that span sections.

        Returns:
            This config, unchanged.

        Raises:
            ConfigError: for the first rule that does not hold, naming its key (and the value).
        """
        # Each section's own rules, in the order of the sections here, then the task's.
        sections = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "task"]
        checks = [check for section in sections for check in section.checks()]
        for key, ok, message in [*checks, *self.task_checks()]:
            if not ok:
                raise ConfigError(f"{key} {message} (got {get_dotted(self.to_dict(), key)!r})")
        flat, defaults = self.flat(), Config().flat()
        for key in self.other_task_keys():
            if flat[key] != defaults[key]:
                owner = next(task for task, keys in TASK_KEYS.items() if key in keys)
                raise ConfigError(f"{key} needs task: {owner} (this config's task is {self.task})")
        generated = self.data.generated.sentences
        if self.data.path is None and not self.pairs and generated < self.train.batch_size:
            raise ConfigError(
                f"train.batch_size ({self.train.batch_size}) is larger than the generated corpus "
                f"(data.generated: {generated} sentences)"
            )
        if self.pairs and self.data.path is None:
            raise ConfigError("task: pairs needs data.path: a file with anchor/positive columns")
        if self.data.path is None and self.data.format != "auto":
            raise ConfigError("data.format is set but data.path is not")
        return self

    def task_checks(self) -> list[tuple[str, bool, str]]:
        """The rules on values that depend on the task."""
        mining, top_k = self.mining, self.mining.top_k
        return [
            ("mining.range_min", 0 <= self.range_min < top_k, "must be in [0, mining.top_k)"),
            (
                "mining.range_max",
                mining.range_max is None or self.range_min < mining.range_max <= top_k,
                "must be in (mining.range_min, mining.top_k]",
            ),
            (
                "train.distill_weight",
                self.train.distill_weight == 0 or self.mining.teacher.model is not None,
                "needs mining.teacher.model (the scores it distils)",
            ),
            (
                "mining.refresh",
                self.refresh != "once" or self.pairs,
                "once needs task: pairs (a corpus is regrouped at epoch boundaries only)",
            ),
        ]

    def other_task_keys(self) -> list[str]:
        """Keys of :data:`TASK_KEYS` that belong to the task this config does not run."""
        return [key for task, keys in TASK_KEYS.items() if task != self.task for key in keys]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def get_dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree
