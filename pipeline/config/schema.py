"""The whole run configuration (:class:`Config`) and its validation, with errors naming the dotted key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.data_section import DataSection
from pipeline.config.eval_section import EvalSection
from pipeline.config.job_sections import RaySection, RunSection, TrackingSection
from pipeline.config.mining_section import MiningSection
from pipeline.config.model_section import ModelSection
from pipeline.config.train_section import CheckpointSection, TrainSection
from pipeline.core.errors import ConfigError


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
        """Check every key's value, then the rules that span sections.

        Returns:
            This config, unchanged.

        Raises:
            ConfigError: for the first rule that does not hold, naming its key (and the value).
        """
        # Each section's own rules, in the order of the sections here.
        checks = [check for f in dataclasses.fields(self) for check in getattr(self, f.name).checks()]
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
