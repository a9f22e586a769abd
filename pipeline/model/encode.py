"""Encoding sentences with a :class:`SentenceEncoder` in eval mode: the one routine the
miner, the evaluator and the benchmarks share.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.model.accel import autocast, to_device
from pipeline.model.encoder import SentenceEncoder


@torch.no_grad()
def encode_rows(
    model: SentenceEncoder,
    corpus: Any,
    rows: np.ndarray,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """Float32 embeddings of corpus rows, in the order of ``rows``: L2-normalised, or the raw
    pooled output with ``normalize=False`` (what whitening is fitted on and export matches).

    Rows are encoded in order of length so batches carry little padding; eval mode, no
    gradient, bf16 autocast on CUDA.
    """
    was_training = model.training
    model.eval()
    order = np.argsort(corpus.lengths[rows], kind="stable")
    out = np.empty((len(rows), model.encoder.config.hidden_size), dtype=np.float32)
    for start in range(0, len(rows), batch_size):
        chunk = order[start : start + batch_size]
        input_ids, mask = corpus.batch(rows[chunk])
        with autocast(device):
            emb = model(to_device(input_ids, device), to_device(mask, device), train_head=False)
        emb = emb.float()
        out[chunk] = (torch.nn.functional.normalize(emb, dim=-1) if normalize else emb).cpu().numpy()
    model.train(was_training)
    return out


def encode_texts(
    model: SentenceEncoder,
    tokenizer: Any,
    texts: list[str],
    max_seq_len: int,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """Embeddings of raw texts (tokenized here, then :func:`encode_rows`)."""
    import pyarrow as pa

    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.tokenized import TokenizedCorpus

    table = tokenize_table(pa.table({"text": texts}), tokenizer, max_seq_len)
    corpus = TokenizedCorpus(table, tokenizer.pad_token_id)
    return encode_rows(model, corpus, np.arange(len(texts)), batch_size, device, normalize)
