"""Shared fixtures: a tiny model and corpus made here (no network, no ../shared), and a
local Ray started for real with its temp files under pytest's tmp dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


@pytest.fixture(scope="session")
def paraphrase_corpus():
    from pipeline.synthetic import generate_paraphrase_corpus

    return generate_paraphrase_corpus(num_groups=60, group_size=4, seed=3)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, paraphrase_corpus):
    from pipeline.model import build_tiny_model_dir

    texts, _ = paraphrase_corpus
    return build_tiny_model_dir(
        texts,
        tmp_path_factory.mktemp("tiny_model"),
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        vocab_size=600,
        max_seq_len=32,
        dropout=0.1,
        seed=0,
    )


@pytest.fixture(scope="session")
def tokenized_corpus(tiny_model_dir, paraphrase_corpus):
    """(arrow table with id/text/input_ids sorted by id, group label per row)."""
    import numpy as np

    from pipeline.data import stable_row_id, tokenize_table
    from pipeline.model import load_tokenizer

    texts, groups = paraphrase_corpus
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    order = np.argsort(ids)
    table = pa.table({"id": ids[order], "text": [texts[i] for i in order]})
    return tokenize_table(table, load_tokenizer(tiny_model_dir), 32), groups[order]


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    import ray

    temp = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=str(temp), logging_level="WARNING")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def job_env(extra: dict | None = None) -> dict:
    """Environment for running jobs/*.py as a user would, isolated from the caller's MLflow."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env.update({"RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env
