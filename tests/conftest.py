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

    return generate_paraphrase_corpus(num_groups=300, group_size=4, seed=3)


@pytest.fixture(scope="session")
def paraphrase_pairs(paraphrase_corpus):
    """(anchors, positives): two pairs from each of 150 paraphrase groups (members 1->2, 2->3)."""
    import numpy as np

    texts, groups = paraphrase_corpus
    anchors, positives = [], []
    for g in np.unique(groups)[:150]:
        members = [t for t, gg in zip(texts, groups, strict=True) if gg == g]
        anchors += members[:2]
        positives += members[1:3]
    return anchors, positives


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


@pytest.fixture(scope="session")
def trained_tiny_model_dir(tmp_path_factory, tiny_model_dir, paraphrase_corpus):
    """The tiny model after 3 quick SimCSE epochs in-process: a random BERT is anisotropic
    (all cosines ~0.98), which makes every similarity-based check meaningless."""
    import torch

    from pipeline.data import TokenizedCorpus, tokenize_table
    from pipeline.losses import simcse_loss
    from pipeline.model import load_sentence_encoder, load_tokenizer, save_model_dir
    from pipeline.plans import random_plan

    texts, _ = paraphrase_corpus
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1)
    corpus = TokenizedCorpus(tokenize_table(pa.table({"text": texts}), tokenizer, 32), tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(0)
    model.train()
    for epoch in range(3):
        for rows in random_plan(len(texts), 48, seed=epoch).batches():
            ids, mask = (torch.from_numpy(a) for a in corpus.batch(rows))
            view1, view2 = model(torch.cat([ids, ids]), torch.cat([mask, mask])).split(len(rows))
            loss = simcse_loss(view1, view2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return save_model_dir(model, tokenizer, tmp_path_factory.mktemp("trained_tiny"), 32)
