"""Turning tokenized rows into embeddings with a :class:`SentenceEncoder` in eval mode: the one
home of encoding, whoever encodes.

:func:`encode_rows` is the routine itself (length-sorted batches, no gradient, bf16 autocast
on CUDA, fp32 on a CPU). The other entry points only decide where it runs:

* :func:`encode_texts`: raw texts, tokenized here first (offline mining, export checks).
* :func:`sharded_encode`: every DDP rank encodes one slice, rank 0 gathers (in-training
  evaluation).
* :func:`encode_with_actor_pool`: a Ray Data pool of encoder actors (the miner's re-encode
  with ``mining.encode_actors``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from pipeline.data.tokenize import tokenize_table
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.model.accel import autocast, compute_device, to_device
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir

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
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
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
        with autocast(device):
            emb = model(to_device(input_ids, device), to_device(mask, device), train_head=False)
        emb = emb.float()
        out[chunk] = (torch.nn.functional.normalize(emb, dim=-1) if normalize else emb).cpu().numpy()
    model.train(was_training)
    return out


def _encode_table(
    model: SentenceEncoder,
    table: Any,
    pad_token_id: int,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """:func:`encode_rows` of every row of an Arrow table with an ``input_ids`` column, in
    the table's order."""

    corpus = TokenizedCorpus(table, pad_token_id)
    rows = np.arange(table.num_rows)
    return encode_rows(model, corpus, rows, batch_size, device, normalize)


def encode_texts(
    model: SentenceEncoder,
    tokenizer: Any,
    texts: list[str],
    max_seq_len: int,
    batch_size: int,
    device: torch.device,
    normalize: bool = True,
) -> np.ndarray:
    """Embeddings of raw texts (tokenized here, truncated to ``max_seq_len``, then
    :func:`encode_rows`); row ``i`` for ``texts[i]``."""
    table = tokenize_table(pa.table({"text": texts}), tokenizer, max_seq_len)
    pad = tokenizer.pad_token_id
    return _encode_table(model, table, pad, batch_size, device, normalize)


def sharded_encode(
    model: SentenceEncoder,
    corpus: Any,
    rows: np.ndarray,
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
    local = encode_rows(model, corpus, mine, encode_batch_size(device), device, normalize=False)
    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return local
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    return np.concatenate(gathered) if rank == 0 else None


class _EncodeBatches:
    """Ray Data actor for :func:`encode_with_actor_pool`: loads the model and the weights
    once, then encodes batch after batch."""

    def __init__(self, model_blob: Any, weights: Any, pooler: str, use_gpu: bool):
        import ray  # deferred, as in encode_with_actor_pool

        quiet_libraries()
        model_dir = unpack_dir(ray.get(model_blob) if isinstance(model_blob, ray.ObjectRef) else model_blob)
        self.pad = load_tokenizer(model_dir).pad_token_id
        self.device = compute_device(use_gpu=use_gpu)
        self.model = load_sentence_encoder(model_dir, pooler=pooler)
        self.model.encoder.load_state_dict(
            ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights
        )
        self.model.to(self.device)

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        embeddings = _encode_table(self.model, batch, self.pad, encode_batch_size(self.device), self.device)
        return {"position": batch.column("position").to_numpy(), "embedding": embeddings}


def encode_with_actor_pool(
    corpus_table: Any,
    lengths: np.ndarray,
    *,
    model_blob: bytes,
    pooler: str,
    encoder_state: dict[str, torch.Tensor],
    actors: int,
    num_cpus: float,
    num_gpus: float,
    label_selector: dict[str, str] | None = None,
) -> np.ndarray:
    """Normalised :func:`encode_rows` of the whole corpus
    on a Ray Data pool of up to ``actors`` encoder actors (each with ``num_cpus`` /
    ``num_gpus``, on nodes ``label_selector`` matches), in batches of :func:`encode_batch_size`
    for the actors' device.

    Rows are fed in order of token length, so each batch pads little; results are placed
    back by position.

    Args:
        corpus_table: the tokenized corpus (an ``input_ids`` column).
        lengths: ``(n,)`` tokens per row.
        model_blob: the packed model folder (:func:`pipeline.model.folders.pack_dir`).
        pooler: ``model.pooler``.
        encoder_state: the encoder weights to encode with.

    Returns:
        ``(n, hidden_size)`` float32 embeddings in the corpus's row order.
    """
    # Deferred: the evaluate job and bench/gpu_step.py import this module without Ray.
    import ray
    import ray.data

    batch_size = encode_batch_size(torch.device("cuda" if num_gpus > 0 else "cpu"))
    order = length_order(lengths)
    table = corpus_table.select(["input_ids"]).append_column("position", pa.array(np.arange(len(lengths))))
    rows_per_block = batch_size * 8
    blocks = [
        ray.put(table.take(order[i : i + rows_per_block])) for i in range(0, len(order), rows_per_block)
    ]
    ds = ray.data.from_arrow_refs(blocks).map_batches(
        _EncodeBatches,
        batch_format="pyarrow",
        batch_size=batch_size,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors),
        # Passed only when set: an actor with a selector of its own is placed differently.
        **({"label_selector": label_selector} if label_selector else {}),
        fn_constructor_kwargs={
            "model_blob": ray.put(model_blob),
            "weights": ray.put(encoder_state),
            "pooler": pooler,
            "use_gpu": num_gpus > 0,
        },
    )
    out: np.ndarray | None = None
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        if out is None:
            out = np.empty((len(lengths), batch["embedding"].shape[1]), dtype=np.float32)
        out[batch["position"]] = batch["embedding"]
    assert out is not None
    return out
