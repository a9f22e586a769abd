"""The whole run configuration (:class:`Config`) and its validation, with errors naming the dotted key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.sections import (
    CheckpointSection,
    ConfigError,
    DataSection,
    EvalSection,
    MiningSection,
    ModelSection,
    RaySection,
    RunSection,
    TrackingSection,
    TrainSection,
)


@dataclass
class Config:
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
    def use_mlp(self) -> bool:
        return self.model.pooler == "cls" if self.model.mlp is None else self.model.mlp

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted-key view of the whole config (for MLflow params)."""
        return flatten(self.to_dict())

    def validate(self) -> Config:
        checks: list[tuple[str, bool, str]] = [
            ("train.temperature", self.train.temperature > 0, "must be > 0"),
            ("train.epochs", self.train.epochs >= 1, "must be >= 1"),
            ("train.batch_size", self.train.batch_size >= 2, "must be >= 2 (in-batch negatives)"),
            ("train.lr", self.train.lr > 0, "must be > 0"),
            ("train.warmup_ratio", 0 <= self.train.warmup_ratio < 1, "must be in [0, 1)"),
            ("train.max_grad_norm", self.train.max_grad_norm > 0, "must be > 0"),
            ("train.num_workers", self.train.num_workers >= 1, "must be >= 1"),
            ("train.cpus_per_worker", self.train.cpus_per_worker > 0, "must be > 0"),
            ("train.log_every", self.train.log_every >= 1, "must be >= 1"),
            ("train.dup_rate", 0 <= self.train.dup_rate <= 1, "must be in [0, 1]"),
            (
                "train.length_group_batches",
                self.train.length_group_batches >= 2,
                "must be >= 2 (batches sorted together)",
            ),
            ("train.max_failures", self.train.max_failures >= -1, "must be >= -1 (-1: no limit)"),
            ("train.placement_timeout_s", self.train.placement_timeout_s > 0, "must be > 0"),
            ("checkpoint.every_steps", self.checkpoint.every_steps >= 0, "must be >= 0"),
            ("checkpoint.keep_last", self.checkpoint.keep_last >= 1, "must be >= 1"),
            ("mining.max_restarts", self.mining.max_restarts >= 0, "must be >= 0"),
            ("tracking.connect_timeout_s", self.tracking.connect_timeout_s > 0, "must be > 0"),
            ("ray.connect_timeout_s", self.ray.connect_timeout_s > 0, "must be > 0"),
            ("tracking.flush_every_s", self.tracking.flush_every_s > 0, "must be > 0"),
            ("tracking.drain_timeout_s", self.tracking.drain_timeout_s >= 0, "must be >= 0"),
            (
                "tracking.system_metrics_interval_s",
                self.tracking.system_metrics_interval_s > 0,
                "must be > 0",
            ),
            (
                "train.batch_size",
                self.train.batch_size >= 2 * self.train.num_workers,
                f"must be >= 2 x train.num_workers ({2 * self.train.num_workers}) so every worker gets rows",
            ),
            ("data.max_seq_len", self.data.max_seq_len >= 4, "must be >= 4"),
            ("data.max_rows", self.data.max_rows is None or self.data.max_rows >= 1, "must be >= 1"),
            ("data.tokenize_batch_size", self.data.tokenize_batch_size >= 1, "must be >= 1"),
            ("data.tokenize_num_cpus", self.data.tokenize_num_cpus > 0, "must be > 0"),
            ("data.tokenize_actors", self.data.tokenize_actors >= 1, "must be >= 1"),
            ("data.generated.num_groups", self.data.generated.num_groups >= 1, "must be >= 1"),
            ("data.generated.group_size", self.data.generated.group_size >= 1, "must be >= 1"),
            ("data.generated.sts_pairs", self.data.generated.sts_pairs >= 0, "must be >= 0"),
            ("model.dropout", 0 <= self.model.dropout < 1, "must be in [0, 1)"),
            ("mining.top_k", self.mining.top_k >= 1, "must be >= 1"),
            (
                "mining.range_min",
                0 <= self.mining.range_min < self.mining.top_k,
                "must be in [0, mining.top_k)",
            ),
            (
                "mining.range_max",
                self.mining.range_max is None
                or self.mining.range_min < self.mining.range_max <= self.mining.top_k,
                "must be in (mining.range_min, mining.top_k]",
            ),
            (
                "mining.relative_margin",
                self.mining.relative_margin is None or 0 <= self.mining.relative_margin < 1,
                "must be in [0, 1)",
            ),
            ("mining.num_negatives", self.mining.num_negatives >= 1, "must be >= 1"),
            ("mining.flat_max_rows", self.mining.flat_max_rows >= 1, "must be >= 1"),
            ("mining.nlist", self.mining.nlist is None or self.mining.nlist >= 1, "must be >= 1"),
            ("mining.nprobe", self.mining.nprobe >= 1, "must be >= 1"),
            ("mining.pq_m", self.mining.pq_m >= 1, "must be >= 1"),
            ("mining.encode_batch_size", self.mining.encode_batch_size >= 1, "must be >= 1"),
            ("mining.encode_actors", self.mining.encode_actors >= 0, "must be >= 0"),
            ("mining.encode_num_cpus", self.mining.encode_num_cpus > 0, "must be > 0"),
            ("mining.encode_num_gpus", self.mining.encode_num_gpus >= 0, "must be >= 0"),
            ("mining.num_cpus", self.mining.num_cpus >= 0, "must be >= 0"),
            ("mining.num_gpus", self.mining.num_gpus >= 0, "must be >= 0"),
            ("mining.timeout_s", self.mining.timeout_s > 0, "must be > 0"),
            ("mining.max_staleness_steps", self.mining.max_staleness_steps >= 0, "must be >= 0"),
            ("tracking.experiment", bool(self.tracking.experiment.strip()), "must not be empty"),
            (
                "tracking.register_as",
                self.tracking.register_as is None or bool(self.tracking.register_as.strip()),
                "must not be empty",
            ),
            ("eval.every_steps", self.eval.every_steps >= 0, "must be >= 0"),
            ("eval.batch_size", self.eval.batch_size >= 1, "must be >= 1"),
            (
                "eval.whitening_dim",
                self.eval.whitening_dim is None or self.eval.whitening_dim >= 1,
                "must be >= 1",
            ),
            ("eval.whitening_rows", self.eval.whitening_rows >= 2, "must be >= 2"),
        ]
        if self.run.name is not None:
            checks.append(
                (
                    "run.name",
                    bool(self.run.name) and all(c.isalnum() or c in "-_." for c in self.run.name),
                    "may hold only letters, digits, '-', '_' and '.'",
                )
            )
        for key, ok, message in checks:
            if not ok:
                raise ConfigError(f"{key} {message} (got {get_dotted(self.to_dict(), key)!r})")
        generated = self.data.generated.num_groups * self.data.generated.group_size
        if (
            self.data.path is None
            and self.mining.negative_mode == "neighbourhood"
            and generated < self.train.batch_size
        ):
            raise ConfigError(
                f"train.batch_size ({self.train.batch_size}) is larger than the generated corpus "
                f"(data.generated: {generated} sentences)"
            )
        if self.mining.negative_mode == "triplet" and self.data.path is None:
            raise ConfigError(
                "mining.negative_mode=triplet needs data.path: a file with anchor/positive columns"
            )
        if self.data.path is None and self.data.format != "auto":
            raise ConfigError("data.format is set but data.path is not")
        return self


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
