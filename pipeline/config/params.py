"""The run's MLflow params: the resolved settings the run used, and only those.

``resolved_config.yaml`` (the whole resolved config) is logged as an artifact beside them; the
params leave out infrastructure, unset values, the other task's keys and what a setting turns
off, so that a reviewer reads only what shaped the model and never a contradiction such as
``mining.top_k=64`` beside ``mining.refresh=never``. Every rule is here, one line each: a key
(or a ``prefix.``) and when it is in effect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.config.model_section import TINY_RANDOM_BERT
from pipeline.config.schema import Config

Rule = tuple[str, Callable[[Config], bool]]

INFRASTRUCTURE = (
    "run.name", "run.output_dir", "run.storage_path", "ray.", "tracking.",
    "train.cpus_per_worker", "train.gpus_per_worker", "train.max_failures", "train.placement_timeout_s",
    "train.log_every", "train.compile", "train.mini_batch_size", "train.label_selector.", "mining.num_cpus", "mining.num_gpus",
    "mining.shards", "mining.label_selector.",
    "mining.timeout_s", "data.tokenize_num_cpus", "data.format", "data.pool_format", "checkpoint.",
)  # fmt: skip
"""Where and how the job runs, not what it trains: resources, timeouts, storage, logging,
how a file is read, compilation (the same model, faster), a pass in pieces (the same gradient,
less memory). They are in ``resolved_config.yaml``
(logged beside the params), never params: a reviewer comparing runs reads the settings that
change the model."""

COLUMN_FORMATS = ("csv", "tsv", "jsonl", "parquet")
"""The formats whose texts come from named columns (``text`` and ``pairs_tsv`` have none)."""


def _pool_has_columns(cfg: Config) -> bool:
    """A pairs run reads ``data.text_column`` from a csv/tsv/jsonl/parquet ``data.pool``."""
    return cfg.data.pool is not None and cfg.data.pool_format in COLUMN_FORMATS


RULES: list[Rule] = [
    (
        "data.text_column",
        lambda cfg: cfg.data.format in COLUMN_FORMATS if not cfg.pairs else _pool_has_columns(cfg),
    ),
    ("data.anchor_column", lambda cfg: cfg.data.format in COLUMN_FORMATS),
    ("data.positive_column", lambda cfg: cfg.data.format in COLUMN_FORMATS),
    ("data.label_column", lambda cfg: cfg.data.format in COLUMN_FORMATS),
    ("data.negative_column", lambda cfg: cfg.data.format in COLUMN_FORMATS),
    # Mining: nothing but mining.refresh when no miner runs.
    ("mining.", lambda cfg: cfg.runs_miner),
    ("mining.max_staleness_steps", lambda cfg: cfg.refresh == "every_epoch_async"),
    ("mining.teacher.", lambda cfg: cfg.mining.teacher.model is not None),
    ("train.distill_loss", lambda cfg: cfg.train.distill_weight > 0),
    ("eval.every_steps", lambda cfg: bool(cfg.eval.sts or cfg.eval.retrieval)),
    ("eval.patience", lambda cfg: bool(cfg.eval.sts or cfg.eval.retrieval)),
]
"""Keys in effect only with another setting; the keys of the other task (:data:`TASK_KEYS`)
are left out as well (:meth:`~pipeline.config.schema.Config.other_task_keys`). The data
formats are read as resolved (``auto`` replaced by the format the extension names)."""


def _matches(key: str, rule_key: str) -> bool:
    return key == rule_key or (rule_key.endswith(".") and key.startswith(rule_key))


def params_in_effect(cfg: Config, *, generated_data: bool = False) -> dict[str, Any]:
    """The MLflow params of a run on ``cfg`` (resolved: formats and ``eval.select_by`` named):
    :meth:`Config.flat` without infrastructure (:data:`INFRASTRUCTURE`), without the keys
    a rule in :data:`RULES` says are not in effect, and without unset values (null, empty
    lists). ``data.generated.*`` only where the run trained on generated data
    (``generated_data``). What the task resolves is logged as resolved; ``mining.refresh``
    is always kept, so a run without a miner says so."""
    off = [key for key, applies in RULES if not applies(cfg)] + cfg.other_task_keys() + list(INFRASTRUCTURE)
    if not generated_data:
        off.append("data.generated.")
    flat = {
        **cfg.flat(),
        "mining.refresh": cfg.refresh,
        "mining.range_min": cfg.range_min,
        "model.name_or_path": cfg.model.name_or_path or TINY_RANDOM_BERT,
    }
    return {
        key: value
        for key, value in flat.items()
        if key == "mining.refresh"
        or (value is not None and value != [] and not any(_matches(key, rule_key) for rule_key in off))
    }
