"""One shard of the miner: a contiguous range of the corpus' texts, encoded with the newest
weights at each refresh, and an index over those of them that are candidates.

A refresh at cluster scale does not fit one process (3 KB a row of vectors at 768 dimensions,
and the index's own copy). With S shards, each holds about 1/S of the texts' tokens, vectors and
index; a query is searched on every shard and the top lists are merged
(:mod:`pipeline.mining.sharded_search`), which with flat indexes is exactly one index's result.
:class:`MinerShard` is plain Python, so it runs in a test or a bench as it is; the miner runs
each as a Ray actor (:class:`~pipeline.mining.miner_shards.MinerShards`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.data.tokenized import CorpusShare, TokenizedBlocks
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec, VectorSource
from pipeline.mining.sharded_search import IndexShard
from pipeline.model.accel import compute_device
from pipeline.model.encode import encode_batch_size, encode_rows
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpack_dir


@dataclass(frozen=True)
class ShardRange:
    """Which texts a shard holds and which of them it indexes."""

    first: int
    """The corpus position of the shard's first text."""
    last: int
    """One past its last text's position."""
    candidates: np.ndarray
    """Sorted corpus positions in ``first .. last - 1`` that searches may return (the pairs
    task's pool; every text for the corpus task)."""
    first_candidate: int
    """How many candidates the shards before this one index: a candidate is returned as its
    ordinal among all the shards' candidates (a position in the pool)."""


def shard_ranges(num_texts: int, candidates: np.ndarray | None, shards: int) -> list[ShardRange]:
    """``shards`` consecutive ranges of the ``num_texts`` corpus positions, as even as whole
    texts allow, each with the ``candidates`` (sorted positions; None: every text) it indexes."""
    bounds = np.linspace(0, num_texts, shards + 1).round().astype(np.int64)
    pool = np.arange(num_texts, dtype=np.int64) if candidates is None else np.asarray(candidates, np.int64)
    at = np.searchsorted(pool, bounds)
    return [
        ShardRange(int(bounds[s]), int(bounds[s + 1]), pool[at[s] : at[s + 1]], int(at[s]))
        for s in range(shards)
    ]


class MinerShard:
    """One shard's texts, their vectors under the newest weights, and its index.

    Args:
        blocks: the tokenized corpus in the object store; the shard takes its range's rows.
        model_blob: the packed model folder (:func:`pipeline.model.folders.pack_dir`).
        pooler: ``model.pooler``.
        span: the texts it holds and the candidates it indexes.
        search: the index kind and device (``mining.index``, ``mining.num_gpus``).
    """

    def __init__(
        self,
        blocks: TokenizedBlocks,
        model_blob: bytes,
        *,
        pooler: str,
        span: ShardRange,
        search: SearchSettings,
    ):
        import ray  # deferred: the lengths travel as an object ref

        quiet_libraries()
        model_dir = unpack_dir(model_blob)
        self.span, self.search_settings = span, search
        tokenizer = load_tokenizer(model_dir)
        self.texts = CorpusShare(blocks, tokenizer.pad_token_id, len(tokenizer))
        lengths = ray.get(blocks.lengths_ref)[span.first : span.last]
        self.texts.hold(np.arange(span.first, span.last, dtype=np.int64), lengths)
        self.device = compute_device(use_gpu=search.use_gpu)
        self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=pooler).to(self.device)
        self.vectors: np.ndarray | None = None
        self.index: IndexShard | None = None

    def ready(self) -> int:
        """This shard's process id: answering proves it was placed and took its texts."""
        return os.getpid()

    def encode(self, encoder_state: dict[str, torch.Tensor], seed: int) -> dict[str, Any]:
        """Encode the shard's texts with ``encoder_state`` and build its index over the
        candidates (``seed``: the IVF training sample). Returns what the merge and the log
        need: ``rows`` indexed, ``backend``, ``kind``, ``dim``, ``build_seconds``,
        ``encode_seconds``."""
        started = time.perf_counter()
        self.model.encoder.load_state_dict(encoder_state)
        held = self.texts.held
        self.index, self.vectors = None, None  # the old ones go before the new vectors arrive
        batch_size = encode_batch_size(self.device)

        def encode(rows: np.ndarray) -> np.ndarray:
            return encode_rows(self.model, held, rows, batch_size, self.device)

        dim = self.model.encoder.config.hidden_size
        if len(self.span.candidates) == len(held):
            # Every text is a candidate: the index holds the only copy of the vectors, encoded
            # a chunk at a time as it is built.
            candidates: np.ndarray | VectorSource = VectorSource(len(held), dim, encode)
        else:
            self.vectors = encode(np.arange(len(held)))
            candidates = self.vectors[self.span.candidates - self.span.first]
        s = self.search_settings
        kind = s.index_kind(len(self.span.candidates), dim)
        # Its candidates are numbered after the shards' before it: ordinals among all of them.
        self.index = IndexShard(
            candidates,
            self.span.first_candidate,
            use_gpu=s.use_gpu,
            spec=IndexSpec(kind),
            seed=seed,
            k=s.top_k,
        )
        return {"rows": self.index.rows, "backend": self.index.backend, "kind": kind, "dim": dim,
                "build_seconds": self.index.build_seconds,
                "encode_seconds": time.perf_counter() - started - self.index.build_seconds}  # fmt: skip

    def vectors_of(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions), dim)`` vectors of corpus positions this shard holds."""
        assert self.index is not None, "MinerShard.vectors_of before encode"
        rows = np.asarray(positions) - self.span.first
        return self.vectors[rows] if self.vectors is not None else self.index.vectors_of(rows)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's top ``k`` among this shard's candidates: scores, and the candidates'
        ordinals among all the shards' (-1: none)."""
        assert self.index is not None, "MinerShard.search before encode"
        return self.index.search(queries, k)
