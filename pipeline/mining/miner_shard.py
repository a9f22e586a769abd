"""One shard of the miner: a contiguous range of the corpus' texts, encoded with the newest
weights at each refresh, and an index over those of them that are candidates.

A refresh at cluster scale does not fit one process (3 KB a row of vectors at 768 dimensions,
and the index's own copy). With S shards, each holds about 1/S of the texts' tokens, vectors and
index; a query is searched on every shard and the top lists are merged
(:func:`~pipeline.mining.index.merge_top_k`): exactly one index's result with flat indexes, and
with IVF ones too, whose cells every shard shares (:func:`~pipeline.mining.index.index_over_cells`).
:class:`MinerShard` is plain Python, so it runs in a test or a bench as it is; the miner runs
each as a Ray actor, or in its own process with one shard
(:class:`~pipeline.mining.miner_shards.MinerShards`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.core.heap import release_free_heap
from pipeline.data.tokenized import CorpusShare, TokenizedBlocks
from pipeline.mining.corpus_partitions import RankedRows
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec, PretrainedIndex, VectorIndex, VectorSource
from pipeline.mining.ivf_training import SampleOnDevice, nearest_cells
from pipeline.model.accel import compute_device
from pipeline.model.encode import encode_batch_size, encode_rows
from pipeline.model.encoder import SentenceEncoder, load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpacked_dir
from pipeline.model.teacher import Teacher, TeacherSettings, load_teacher

ASSIGN_CHUNK_ROWS = 65_536
"""Vectors assigned to their nearest centroid at once (:meth:`MinerShard.cell_counts`)."""


@dataclass(frozen=True)
class ShardRange:
    """Which texts a shard holds and which of them it indexes."""

    first: int
    """The corpus position of the shard's first text."""
    last: int
    """One past its last text's position."""
    pool: np.ndarray | None
    """Sorted corpus positions in ``first .. last - 1`` that searches may return (the pairs
    task's pool); None: every text of the range (the corpus task), with no array a row."""
    first_candidate: int
    """How many candidates the shards before this one index: a candidate is returned as its
    ordinal among all the shards' candidates (a position in the pool)."""

    @property
    def count(self) -> int:
        """The candidates it indexes."""
        return self.last - self.first if self.pool is None else len(self.pool)

    def positions(self, numbers: np.ndarray) -> np.ndarray:
        """The corpus positions of its candidates numbered ``numbers`` (from 0)."""
        return np.asarray(numbers, dtype=np.int64) + self.first if self.pool is None else self.pool[numbers]

    @property
    def candidates(self) -> np.ndarray:
        """Every candidate's corpus position."""
        return self.positions(np.arange(self.count))


def shard_ranges(num_texts: int, candidates: np.ndarray | None, shards: int) -> list[ShardRange]:
    """``shards`` consecutive ranges of the ``num_texts`` corpus positions, as even as whole
    texts allow, each with the ``candidates`` (sorted positions; None: every text) it indexes."""
    bounds = np.linspace(0, num_texts, shards + 1).round().astype(np.int64)
    if candidates is None or len(candidates) == num_texts:  # sorted distinct positions: all of them
        return [ShardRange(int(bounds[s]), int(bounds[s + 1]), None, int(bounds[s])) for s in range(shards)]
    pool = np.asarray(candidates, np.int64)
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
        teacher: the pairs task's teacher (``mining.teacher``), loaded here on this shard's
            device; None: none.
        teacher_blob: the teacher's folder as the driver packed it; None: ``teacher.model`` is
            read on this shard's node (:func:`~pipeline.model.teacher.load_teacher`).
    """

    def __init__(
        self,
        blocks: TokenizedBlocks,
        model_blob: bytes,
        *,
        pooler: str,
        span: ShardRange,
        search: SearchSettings,
        teacher: TeacherSettings | None = None,
        teacher_blob: bytes | None = None,
    ):
        import ray  # deferred: the lengths travel as an object ref

        quiet_libraries()
        self.span, self.search_settings = span, search
        self.device = compute_device(use_gpu=search.use_gpu)
        with unpacked_dir(model_blob) as model_dir:
            tokenizer = load_tokenizer(model_dir)
            self.model: SentenceEncoder = load_sentence_encoder(model_dir, pooler=pooler).to(self.device)
        self.texts = CorpusShare(blocks, tokenizer.pad_token_id, len(tokenizer))
        lengths = ray.get(blocks.lengths_ref)[span.first : span.last]
        self.texts.hold(np.arange(span.first, span.last, dtype=np.int64), lengths)
        self.dim: int = self.model.encoder.config.hidden_size
        self.vectors: np.ndarray | None = None
        self.index: VectorIndex | None = None
        """Over this shard's candidates, numbered from 0 (searches add ``span.first_candidate``)."""
        self.sample: tuple[int, np.ndarray, np.ndarray] | None = None
        """The refresh's seed, and this shard's rows of the shared IVF sample and their vectors,
        from :meth:`encode_sample` until :meth:`encode` adds them to its index."""
        self.keys: np.ndarray | None = None
        """The held texts' keys, once asked (:meth:`keys_of`)."""
        self.assignment: np.ndarray | None = None
        self.ranked: RankedRows | None = None
        """The held texts in this refresh's partition order, from :meth:`order_by_cell`."""
        self.batches: dict[int, np.ndarray] = {}
        """Refresh version -> ``(held,)`` int32 each held text's batch in its plan (-1: not yet
        planned), for the churn (:meth:`record_batches`): this refresh's and the last."""
        self.teacher: Teacher | None = None
        if teacher is not None:
            self.teacher = load_teacher(teacher, blob=teacher_blob, device=self.device.type)

    def ready(self) -> int:
        """This shard's process id: answering proves it was placed and took its texts."""
        return os.getpid()

    def index_kind(self) -> str:
        """The index kind this shard's candidates need, checked against the memory free where it
        runs (:meth:`~pipeline.mining.hard_negatives.SearchSettings.index_kind`); every shard
        builds the most compact kind any of them needs (:meth:`MinerShards.encode`)."""
        return self.search_settings.index_kind(self.span.count, self.dim)

    def encode_sample(
        self, encoder_state: dict[str, torch.Tensor] | None, seed: int, rows: np.ndarray | None
    ) -> dict[str, Any]:
        """The first half of a refresh whose IVF cells every shard shares: encode this shard's
        part of the sample they are trained on (``rows``: numbers among its candidates; None: a
        flat index, which trains nothing) with ``encoder_state``, and keep the vectors for the
        k-means (:meth:`sample_assign`) and for :meth:`encode`. Returns ``dim`` and ``seconds``."""
        started = time.perf_counter()
        self.index, self.vectors = None, None  # the old ones go before the sample is trained on
        release_free_heap()
        self._load(encoder_state)
        if rows is not None:
            self.sample = (seed, rows, self._encode(self.span.positions(rows) - self.span.first))
        return {"dim": self.dim, "seconds": time.perf_counter() - started}

    def sample_assign(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One k-means round over this shard's part of the sample, on its device
        (:meth:`~pipeline.mining.ivf_training.SampleOnDevice.assign_to`)."""
        assert self.sample is not None, "MinerShard.sample_assign before encode_sample"
        return SampleOnDevice(self.sample[2], self.device).assign_to(centroids)

    def sample_vectors(self, picks: np.ndarray) -> np.ndarray:
        """Vectors of this shard's part of the sample at ``picks`` (numbers within the part)."""
        assert self.sample is not None, "MinerShard.sample_vectors before encode_sample"
        return self.sample[2][picks]

    def encode(
        self,
        encoder_state: dict[str, torch.Tensor] | None,
        seed: int,
        kind: str,
        trained: np.ndarray | None = None,
        sample_rows: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Encode the shard's texts with ``encoder_state`` and build its index of ``kind`` over
        the candidates: flat, or ``trained`` (an empty IVF index every shard fills,
        :func:`~pipeline.mining.index.index_over_cells`) with its part of the sample at
        ``sample_rows`` (vectors from :meth:`encode_sample`, or encoded here by a shard started
        since). Returns what the merge and the log need: ``rows`` indexed, ``backend``,
        ``kind``, ``dim``, ``build_seconds``, ``encode_seconds``."""
        started = time.perf_counter()
        self._load(encoder_state)
        held = self.texts.held
        self.index, self.vectors = None, None  # the old ones go before the new vectors arrive
        self.ranked = None
        release_free_heap()
        span, dim = self.span, self.dim
        every_text = span.pool is None
        if every_text:
            # Every text is a candidate: the index holds the only copy of the vectors, encoded
            # a chunk at a time as it is built.
            candidates: np.ndarray | VectorSource = VectorSource(len(held), dim, self._encode)
        else:
            self.vectors = self._encode(np.arange(len(held)))
            candidates = self.vectors[span.candidates - span.first]
        pretrained = None
        if trained is not None and sample_rows is not None:
            sampled = self.sample
            if not every_text:
                vectors = candidates[sample_rows]
            elif sampled is not None and sampled[0] == seed and np.array_equal(sampled[1], sample_rows):
                vectors = sampled[2]
            else:
                vectors = self._encode(span.positions(sample_rows) - span.first)
            pretrained = PretrainedIndex(trained, sample_rows, vectors)
        self.sample = None
        s = self.search_settings
        self.index = VectorIndex(
            candidates, use_gpu=s.use_gpu, spec=IndexSpec(kind), k=s.top_k, pretrained=pretrained
        )
        return {"rows": self.index.rows, "backend": self.index.backend, "kind": kind, "dim": dim,
                "build_seconds": self.index.build_seconds,
                "encode_seconds": time.perf_counter() - started - self.index.build_seconds}  # fmt: skip

    def _load(self, encoder_state: dict[str, torch.Tensor] | None) -> None:
        """Take the newest weights (None: keep those loaded, the model folder's at the start)."""
        if encoder_state is not None:
            self.model.encoder.load_state_dict(encoder_state)

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), dim)`` vectors of the held texts at ``rows`` under the loaded weights."""
        return encode_rows(
            self.model, self.texts.held, rows, batch_size=encode_batch_size(self.device), device=self.device
        )

    def vectors_of(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions), dim)`` vectors of corpus positions this shard holds."""
        assert self.index is not None, "MinerShard.vectors_of before encode"
        rows = np.asarray(positions) - self.span.first
        return self.vectors[rows] if self.vectors is not None else self.index.vectors_of(rows)

    def pair_scores(self, positions: np.ndarray, others: np.ndarray) -> np.ndarray:
        """``(m,)`` float32 cosine of each held text at ``positions`` with the vector beside it
        in ``others`` (``(m, dim)``)."""
        return np.einsum("ij,ij->i", self.vectors_of(positions), others).astype(np.float32)

    def teacher_scores(self, texts: list[str], left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(len(left),)`` float32: the teacher's score of each pair ``(texts[left[i]],
        texts[right[i]])`` on this shard's device, where its student encodes
        (:meth:`~pipeline.model.teacher.Teacher.score_indexed`)."""
        assert self.teacher is not None, "MinerShard.teacher_scores without a teacher"
        return self.teacher.score_indexed(texts, left, right)

    def teacher_computed(self) -> tuple[int, str]:
        """What this shard's teacher has computed so far (:meth:`~pipeline.model.teacher.
        Teacher.computed`)."""
        assert self.teacher is not None, "MinerShard.teacher_computed without a teacher"
        return self.teacher.computed()

    def cell_counts(self, centroids: np.ndarray) -> np.ndarray:
        """``(cells,)`` int64: how many held texts have each of the unit ``centroids`` as their
        most similar, found on this shard's device, :data:`ASSIGN_CHUNK_ROWS` vectors at a
        time; each text's cell is kept for :meth:`order_by_cell`."""
        assert self.index is not None, "MinerShard.cell_counts before encode"
        held = self.span.last - self.span.first
        self.assignment = np.empty(held, dtype=np.int32)
        for lo in range(0, held, ASSIGN_CHUNK_ROWS):
            rows = self.vectors_of(np.arange(lo, min(lo + ASSIGN_CHUNK_ROWS, held)) + self.span.first)
            cells, _ = nearest_cells(torch.from_numpy(np.ascontiguousarray(rows)).to(self.device), centroids)
            self.assignment[lo : lo + len(rows)] = cells.cpu().numpy()
        return np.bincount(self.assignment, minlength=len(centroids))

    def order_by_cell(self, offsets: np.ndarray) -> None:
        """Rank the held texts in the corpus' partition order (:class:`~pipeline.mining.
        corpus_partitions.RankedRows`), ``offsets`` this shard's row of
        :func:`~pipeline.mining.corpus_partitions.rank_offsets`."""
        assert self.assignment is not None, "MinerShard.order_by_cell before cell_counts"
        self.ranked = RankedRows(self.assignment, self.span.first, offsets)
        self.assignment = None

    def rows_ranked(self, lo: int, hi: int) -> np.ndarray:
        """The sorted positions of the held texts ranked ``lo`` to ``hi - 1``."""
        assert self.ranked is not None, "MinerShard.rows_ranked before order_by_cell"
        return self.ranked.between(lo, hi)

    def keys_of(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions),)`` int64 text keys of held texts, read from the corpus' blocks
        at the first call."""
        import ray  # deferred, as in __init__

        if self.keys is None:
            held = np.arange(self.span.first, self.span.last, dtype=np.int64)
            parts = [ray.get(ref).column("text_key").to_numpy()
                     for ref in self.texts.blocks.take_refs(held, columns=("text_key",))]  # fmt: skip
            self.keys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return self.keys[np.asarray(positions, dtype=np.int64) - self.span.first]

    def record_batches(
        self, positions: np.ndarray, batches: np.ndarray, *, version: int, previous: int | None
    ) -> np.ndarray:
        """Keep the held texts' (``positions``) ``batches`` in refresh ``version``'s plan, and
        answer their batches in refresh ``previous``'s (-1: not known here); the first call of a
        refresh drops every plan's but ``previous``'s."""
        if version not in self.batches:
            self.batches = {v: b for v, b in self.batches.items() if v == previous}
            self.batches[version] = np.full(self.span.last - self.span.first, -1, dtype=np.int32)
        at = np.asarray(positions, dtype=np.int64) - self.span.first
        self.batches[version][at] = batches
        earlier = self.batches.get(previous) if previous is not None else None
        return earlier[at] if earlier is not None else np.full(len(at), -1, dtype=np.int32)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's top ``k`` among this shard's candidates: scores, and the candidates'
        ordinals among all the shards' (-1: none)."""
        assert self.index is not None, "MinerShard.search before encode"
        return self._numbered(*self.index.search(queries, k))

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` from every candidate, whatever the index."""
        assert self.index is not None, "MinerShard.exact_search before encode"
        return self._numbered(*self.index.exact_search(queries, k))

    def _numbered(self, scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A search's answer with this shard's candidates numbered after the shards' before it:
        ordinals among all of them, as the merge needs (-1 stays none)."""
        return scores, np.where(rows >= 0, rows + self.span.first_candidate, -1)

    def set_nprobe(self, nprobe: int) -> None:
        """Probe ``nprobe`` of the shared IVF cells a query from now on."""
        assert self.index is not None, "MinerShard.set_nprobe before encode"
        self.index.set_nprobe(nprobe)
