"""The run's MLflow params: the resolved settings the run used, and only those.

``config.yaml`` (the whole resolved config) is logged as an artifact beside them; the params
leave out what a setting turns off, so that a reviewer never reads a contradiction such as
``mining.num_gpus=1.0`` beside ``mining.refresh=never``. Every rule is here, one line
each: a key (or a ``prefix.``) and when it is in effect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.config.schema import Config

Rule = tuple[str, Callable[[Config], bool]]


def _pairs(cfg: Config) -> bool:
    return cfg.pairs


def _pool_has_columns(cfg: Config) -> bool:
    """A pairs run reads ``data.text_column`` from a csv/tsv/jsonl/parquet ``data.pool`` (with
    ``pool_format: auto`` the extension decides, which a rule cannot see: it counts)."""
    return cfg.data.pool is not None and cfg.data.pool_format not in ("text", "pairs_tsv")


RULES: list[Rule] = [
    ("train.hard_negative_weight", _pairs),
    ("data.text_column", lambda cfg: not _pairs(cfg) or _pool_has_columns(cfg)),
    ("data.anchor_column", _pairs),
    ("data.positive_column", _pairs),
    ("data.negative_column", _pairs),
    ("data.label_column", _pairs),
    ("data.given_negatives", _pairs),
    ("data.pool", _pairs),
    ("data.pool_format", _pairs),
    # Mining: nothing but mining.refresh when no miner runs; then what the chosen mode,
    # index and sampler read.
    ("mining.", lambda cfg: cfg.runs_miner),
    (
        "mining.max_staleness_steps",
        lambda cfg: cfg.mining.refresh == "every_epoch_async",
    ),
    ("mining.num_negatives", _pairs),
    ("mining.random_negatives", _pairs),
    ("mining.batch_sampler", lambda cfg: not _pairs(cfg)),
]


def _matches(key: str, rule_key: str) -> bool:
    return key == rule_key or (rule_key.endswith(".") and key.startswith(rule_key))


def params_in_effect(cfg: Config) -> dict[str, Any]:
    """``cfg``'s dotted keys and values (:meth:`Config.flat`) without those a rule in
    :data:`RULES` says are not in effect (``mining.refresh`` is always kept)."""
    off = [key for key, applies in RULES if not applies(cfg)]
    return {
        key: value
        for key, value in cfg.flat().items()
        if key == "mining.refresh" or not any(_matches(key, rule_key) for rule_key in off)
    }
