"""The sampler registry is the one list of batch samplers: config validation, the miner's
factory and the docs table all follow it."""

from __future__ import annotations

import pytest
from conftest import REPO

from pipeline.batching.registry import SAMPLER_NAMES, SAMPLERS, build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError


def test_config_accepts_exactly_the_registered_samplers():
    for name in SAMPLER_NAMES:
        assert load_config(None, [f"mining.batch_sampler={name}"]).mining.batch_sampler == name
    assert SAMPLER_NAMES == ("random", "knn")
    with pytest.raises(ConfigError, match="mining.batch_sampler must be one of random, knn"):
        load_config(None, ["mining.batch_sampler=nearest"])


def test_unknown_name_is_one_clear_error():
    import numpy as np

    inputs = SamplerInputs(np.full((4, 2), -1), np.zeros((4, 2)), None, 2, 0, 1)
    with pytest.raises(ValueError, match="got 'nearest'"):
        build_plan("nearest", inputs)


def test_docs_table_lists_every_sampler():
    text = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    assert [s.name for s in SAMPLERS.values() if f"| `{s.name}` | {s.summary} |" not in text] == []
