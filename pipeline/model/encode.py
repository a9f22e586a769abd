"""Turning tokenized rows into embeddings with a :class:`SentenceEncoder` in eval mode: the one
home of encoding, whoever encodes.

:func:`encode_rows` is the routine itself (length-sorted batches, no gradient, bf16 autocast
on CUDA, fp32 on a CPU). The other entry points only decide where it runs:

* :func:`encode_texts`: raw texts, tokenized here first (offline mining, export checks).
* :func:`sharded_encode`: every DDP rank encodes one slice, rank 0 gathers (in-training
  evaluation).

The miner's shards (:mod:`pipeline.mining.miner_shard`) each encode their range of the corpus
with :func:`encode_rows`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from pipeline.data.tokenize import tokenize_table
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.model.accel import autocast, to_device
from pipeline.model.encoder import SentenceEncoder

# Sentences per encode batch. CPU: 64 was the fastest batch there (docs/benchmarks.md, Corpus
# encoding). GPU: BERT-base on an H100 encoded 6,874 sentences/s at 128, 20,727 at 512 and
# 21,647 at 2,048 (docs/benchmarks.md, Per-worker compute: base BERT on one H100).
CPU_ENCODE_BATCH_SIZE = 64
GPU_ENCODE_BATCH_SIZE = 1024


def encode_batch_size(device: torch.device) -> int:
    """Sentences per forward pass when encoding on ``device``: the one batch size of every
    encode (the miner, its actor pool, evaluation, offline mining)."""
    return GPU_ENCODE_BATCH_SIZE if device.type == "cuda" else CPU_ENCODE_BATCH_SIZE


def length_order(lengths: np.ndarray) -> np.ndarray:
    """Positions of ``lengths`` from shortest to longest (stable): the order in which rows are
    batched, so that each batch pads little."""
    return np.argsort(lengths, kind="stable")


@torch.no_grad()
def encode_rows(
    model: SentenceEncoder,
    corpus: Any,
    rows: np.ndarray,
    *,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
    bf16: bool | None = None,
) -> np.ndarray:
    """Float32 embeddings of corpus rows, in the order of ``rows``: L2-normalised, or the raw
    pooled output with ``normalize=False`` (what whitening is fitted on and export matches).

    Rows are encoded in order of length so batches carry little padding; eval mode, no
    gradient, autocast as :func:`pipeline.model.accel.autocast` sets it.

    Args:
        model: the encoder; left in the train/eval mode it came in.
        corpus: a :class:`pipeline.data.tokenized.TokenizedCorpus` (anything with ``lengths``
            and ``batch(rows)``).
        rows: ``(n,)`` corpus positions to encode.
        batch_size: rows per forward pass.
        device: where the model is.
        normalize: L2-normalise the embeddings.
        bf16: encode under bf16 autocast; None: where
            :func:`~pipeline.model.accel.encodes_bf16` (the teacher chooses its own).

    Returns:
        ``(n, hidden_size)`` float32 embeddings, row ``i`` for ``rows[i]``.
    """
    was_training = model.training
    model.eval()
    order = length_order(corpus.lengths[rows])
    out = np.empty((len(rows), model.encoder.config.hidden_size), dtype=np.float32)
    for start in range(0, len(rows), batch_size):
        chunk = order[start : start + batch_size]
        input_ids, mask = corpus.batch(rows[chunk])
        with autocast(device, bf16):
            emb = model(to_device(input_ids, device), to_device(mask, device), train_head=False)
        emb = emb.float()
        out[chunk] = (torch.nn.functional.normalize(emb, dim=-1) if normalize else emb).cpu().numpy()
    model.train(was_training)
    return out


def encode_texts(
    model: SentenceEncoder,
    tokenizer: Any,
    texts: list[str],
    *,
    max_seq_len: int,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
    bf16: bool | None = None,
) -> np.ndarray:
    """Embeddings of raw texts (tokenized here, truncated to ``max_seq_len``, then
    :func:`encode_rows`, ``bf16`` as there); row ``i`` for ``texts[i]``."""
    table = tokenize_table(pa.table({"text": texts}), tokenizer, max_seq_len)
    corpus = TokenizedCorpus(table, tokenizer.pad_token_id)
    return encode_rows(
        model,
        corpus,
        np.arange(table.num_rows),
        batch_size=batch_size,
        device=device,
        normalize=normalize,
        bf16=bf16,
    )


def sharded_encode(
    model: SentenceEncoder,
    corpus: Any,
    rows: np.ndarray,
    *,
    device: torch.device,
    rank: int,
    world: int,
) -> np.ndarray | None:
    """Raw (unnormalised) :func:`encode_rows` of ``rows`` in batches of
    :func:`encode_batch_size`, each DDP worker encoding one contiguous slice; every rank must
    call it.

    Returns:
        The whole ``(len(rows), hidden_size)`` array on rank 0 (and without a process
        group), None on the other ranks.
    """
    mine = np.array_split(rows, world)[rank]
    local = encode_rows(
        model, corpus, mine, batch_size=encode_batch_size(device), device=device, normalize=False
    )
    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return local
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return np.concatenate(gathered) if rank == 0 else None
