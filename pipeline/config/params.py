"""The run's MLflow params: the resolved settings the run used, and only those.

``config.yaml`` (the whole resolved config) is logged as an artifact beside them; the params
leave out the other task's keys and what a setting turns off, so that a reviewer never reads a contradiction such as
``mining.num_gpus=1.0`` beside ``mining.refresh=never``. Every rule is here, one line
each: a key (or a ``prefix.``) and when it is in effect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.config.schema import Config

Rule = tuple[str, Callable[[Config], bool]]


def _pool_has_columns(cfg: Config) -> bool:
    """A pairs run reads ``data.text_column`` from a csv/tsv/jsonl/parquet ``data.pool`` (with
    ``pool_format: auto`` the extension decides, which a rule cannot see: it counts)."""
    return cfg.data.pool is not None and cfg.data.pool_format not in ("text", "pairs_tsv")


RULES: list[Rule] = [
    ("data.text_column", lambda cfg: not cfg.pairs or _pool_has_columns(cfg)),
    # Mining: nothing but mining.refresh when no miner runs.
    ("mining.", lambda cfg: cfg.runs_miner),
    ("mining.max_staleness_steps", lambda cfg: cfg.refresh == "every_epoch_async"),
]
"""Keys in effect only with another setting; the keys of the other task (:data:`TASK_KEYS`)
are left out as well (:meth:`~pipeline.config.schema.Config.other_task_keys`)."""


def _matches(key: str, rule_key: str) -> bool:
    return key == rule_key or (rule_key.endswith(".") and key.startswith(rule_key))


def params_in_effect(cfg: Config) -> dict[str, Any]:
    """``cfg``'s dotted keys and values (:meth:`Config.flat`) without those a rule in
    :data:`RULES` says are not in effect (``mining.refresh`` is always kept)."""
    off = [key for key, applies in RULES if not applies(cfg)] + cfg.other_task_keys()
    # Keys the task resolves are logged as resolved: what the run did, not "null".
    flat = {**cfg.flat(), "mining.refresh": cfg.refresh, "mining.range_min": cfg.range_min}
    return {
        key: value
        for key, value in flat.items()
        if key == "mining.refresh" or not any(_matches(key, rule_key) for rule_key in off)
    }
