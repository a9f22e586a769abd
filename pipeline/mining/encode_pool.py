"""Re-encoding the corpus on a Ray Data pool of encoder actors (``mining.encode_actors``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.data.tokenized import TokenizedCorpus
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import quiet_libraries, unpack_dir


class _EncodeBatches:
    """Ray Data actor for :func:`encode_with_actor_pool`: loads the model and the weights
    once, then encodes batch after batch."""

    def __init__(self, model_blob: Any, weights: Any, pooler: str, batch_size: int, use_gpu: bool):
        import ray

        from pipeline.model.folders import load_tokenizer

        quiet_libraries()
        model_dir = unpack_dir(ray.get(model_blob) if isinstance(model_blob, ray.ObjectRef) else model_blob)
        self.pad = load_tokenizer(model_dir).pad_token_id
        self.device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        self.model = load_sentence_encoder(model_dir, pooler=pooler)
        self.model.encoder.load_state_dict(
            ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights
        )
        self.model.to(self.device)
        self.batch_size = batch_size

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        corpus = TokenizedCorpus(batch, self.pad)
        rows = np.arange(batch.num_rows)
        embeddings = encode_rows(self.model, corpus, rows, self.batch_size, self.device)
        return {"position": batch.column("position").to_numpy(), "embedding": embeddings}


def encode_with_actor_pool(
    corpus_table: Any,
    lengths: np.ndarray,
    model_blob: bytes,
    pooler: str,
    encoder_state: dict[str, torch.Tensor],
    batch_size: int,
    actors: int,
    num_cpus: float,
    num_gpus: float,
) -> np.ndarray:
    """Encode the corpus with a Ray Data pool of up to ``actors`` encoder actors.

    Rows are fed in order of token length, so each batch pads little; results are placed
    back by position.
    """
    import pyarrow as pa
    import ray
    import ray.data

    order = np.argsort(lengths, kind="stable")
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
        fn_constructor_kwargs={
            "model_blob": ray.put(model_blob),
            "weights": ray.put(encoder_state),
            "pooler": pooler,
            "batch_size": batch_size,
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
