"""The ``mining`` section of the config: hard-negative mining between epochs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.batching.registry import SAMPLER_NAMES
from pipeline.config.check import Check

SamplerName = Literal[SAMPLER_NAMES]  # the names pipeline.batching.registry declares


@dataclass
class MiningSection:
    enabled: bool = True
    """Run the miner at all (see ``refresh`` for when it mines)."""

    @property
    def mines(self) -> bool:
        """Whether the run mines at all: enabled and ``refresh`` is not ``never``."""
        return self.enabled and self.refresh != "never"

    @property
    def refreshes_at_boundaries(self) -> bool:
        """Whether epoch boundaries ask the miner for a plan from the newest weights."""
        return self.mines and self.refresh == "every_epoch"

    top_k: int = 64
    """Neighbours searched per row (the candidate list every filter works on)."""
    range_min: int | None = None
    """Skip this many nearest candidates of those the other filters left (sentence-transformers'
    order). ``None``: 10 in the corpus task, 0 in the pairs task.
    The corpus task has no positive to measure a candidate against, and the top ranks of a
    natural corpus are mostly paraphrases, i.e. false negatives: 10 is where FlagEmbedding's
    hn_mine window starts and what the sentence-transformers mining example uses. The pairs task
    knows each anchor's positives (all excluded) and has the relative margin against the
    positive's score, so the nearest surviving candidates are the true hard negatives a
    retriever must learn to rank below its positives: skipping 10 of them would throw those
    away where each anchor has only a few positives."""
    range_max: int | None = None
    """Consider candidates ranked below this only (``None``: all ``top_k``)."""
    max_score: float | None = None
    """Drop candidates more similar than this to the anchor."""
    relative_margin: float | None = 0.05
    """Keep a candidate only if sim <= pos - |pos| x margin, pos = sim(anchor, positive);
    NV-Retriever's 0.05."""
    num_negatives: int = 1
    """Negatives per anchor (offline mining and the pairs task)."""
    sampling: Literal["top", "random"] = "top"
    index: Literal["auto", "flat", "ivf", "ivfpq"] = "auto"
    """``auto``: exact flat search up to ``flat_max_rows`` vectors, IVF above."""
    flat_max_rows: int = 50_000
    """Largest corpus ``auto`` searches exactly. All-rows flat search grows as n^2, IVF's about
    as n^1.5 for a small loss of recall, so the default suits CPUs; GPU clusters, where flat
    search is far faster, can raise it. See docs/benchmarks.md (Mining refresh at scale: a real
    model on CPU)."""
    nlist: int | None = None
    """IVF cells (``None``: 4 x sqrt(rows))."""
    nprobe: int = 32
    """IVF cells searched per query: more cells, higher recall, slower search. See
    docs/benchmarks.md (Mining refresh at scale: a real model on CPU)."""
    pq_m: int = 16
    """Bytes per vector for ``ivfpq``."""
    encode_batch_size: int = 64
    """Sentences per encode batch in the miner. The default suits CPUs; a GPU wants far larger
    batches (``jobs/configs/cluster-gpu.yaml`` sets 1024). See docs/benchmarks.md (Corpus
    encoding; Per-worker compute: base BERT on one H100)."""
    encode_actors: int = 0
    """0: the miner actor encodes the corpus itself. N: the re-encode fans out over a Ray
    Data pool of up to N actors (each with ``encode_num_cpus``/``encode_num_gpus``); they
    need resources beyond those the train workers and the miner hold."""
    encode_num_cpus: float = 1.0
    encode_num_gpus: float = 0.0
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    """GPUs for the miner actor; with a GPU it encodes there and searches with a GPU index."""
    batch_sampler: SamplerName = "random"
    """How a refreshed epoch's rows are grouped into batches (the corpus task); every
    sampler covers each row once, in balanced batches, and keeps flagged false negatives
    apart. ``random`` (the default, because no sampler has yet beaten it on dev scores by
    more than the seed spread: docs/results.md): random batches with each row's flagged
    false negatives kept apart; the refresh then measures them (``mining/`` metrics).
    ``knn``: each batch grown from a seed row's nearest neighbours (Prim's order), the
    BatchSampler paper's kNN baseline. See docs/results.md for what each measured."""
    random_negatives: int = 0
    """Pairs task: random negatives added per anchor beside its ``num_negatives`` mined
    ones (drawn from the positives' pool, duplicates of the anchor and positive excluded);
    mixing is what worked in tevatron #43."""
    refresh: Literal["every_epoch", "once", "never"] = "every_epoch"
    """Triplet (pair) mode: when negatives are mined. ``every_epoch``: once before epoch 1 with
    the starting model (static, as sentence-transformers' ``mine_hard_negatives`` does), then
    again at every epoch boundary with the newest weights (ANCE). ``once``: before epoch 1
    only; later epochs reshuffle the rows and keep their negatives. ``never``: no mining (the
    given negatives and in-batch negatives only), the same as ``enabled: false``.
    Corpus task: ``every_epoch`` or ``never`` (its epoch 1 is always random)."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: refresh at the epoch boundary while training waits. ``async``: the miner
    works while training goes on, from weights at most ``max_staleness_steps`` old at the
    boundary; training never waits for it."""
    max_staleness_steps: int = 50
    """Async: steps before an epoch's end at which the weights are snapshotted for the refresh."""
    timeout_s: float = 3600.0
    """Longest a training worker waits for one refresh (or for the miner to come back after a
    restart) before failing with a clear error."""
    start_timeout_s: float = 600.0
    """Longest the job waits at start for the miner actor to be placed and to load its inputs
    (an autoscaled GPU node can take minutes to join); apart from ``timeout_s`` so that a short
    refresh deadline does not also cut the placement short."""
    max_restarts: int = 3
    """Times a dead miner actor is restarted (it then re-mines from the newest weights)
    before the job fails."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("mining.max_restarts", self.max_restarts >= 0, "must be >= 0"),
            ("mining.top_k", self.top_k >= 1, "must be >= 1"),
            (
                "mining.relative_margin",
                self.relative_margin is None or 0 <= self.relative_margin < 1,
                "must be in [0, 1)",
            ),
            ("mining.num_negatives", self.num_negatives >= 1, "must be >= 1"),
            ("mining.flat_max_rows", self.flat_max_rows >= 1, "must be >= 1"),
            ("mining.nlist", self.nlist is None or self.nlist >= 1, "must be >= 1"),
            ("mining.nprobe", self.nprobe >= 1, "must be >= 1"),
            ("mining.pq_m", self.pq_m >= 1, "must be >= 1"),
            ("mining.encode_batch_size", self.encode_batch_size >= 1, "must be >= 1"),
            ("mining.encode_actors", self.encode_actors >= 0, "must be >= 0"),
            ("mining.encode_num_cpus", self.encode_num_cpus > 0, "must be > 0"),
            ("mining.encode_num_gpus", self.encode_num_gpus >= 0, "must be >= 0"),
            ("mining.num_cpus", self.num_cpus >= 0, "must be >= 0"),
            ("mining.num_gpus", self.num_gpus >= 0, "must be >= 0"),
            ("mining.timeout_s", self.timeout_s > 0, "must be > 0"),
            ("mining.start_timeout_s", self.start_timeout_s > 0, "must be > 0"),
            ("mining.max_staleness_steps", self.max_staleness_steps >= 0, "must be >= 0"),
            ("mining.random_negatives", self.random_negatives >= 0, "must be >= 0"),
        ]
