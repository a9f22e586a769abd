"""The ``mining`` section of the config: hard-negative mining between epochs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.batching.registry import SAMPLER_NAMES
from pipeline.config.check import Check

SamplerName = Literal[SAMPLER_NAMES]  # the names pipeline.batching.registry declares


@dataclass
class TeacherSection:
    """Pairs task: a stronger model that scores each anchor's positive and mined negatives at
    every refresh, for denoising (``denoise_margin``) and distillation
    (``train.distill_weight``). Its scores ride beside the negatives as a column and are
    logged as ``mining/teacher_*`` metrics. It reads the texts with its own tokenizer, cut at
    ``data.max_seq_len`` tokens a text (twice that a pair), as many a forward pass as every encode
    on its device (1,024 on a GPU, 64 on a CPU)."""

    model: str | None = None
    """A model folder every node reads, or a hub name (fetched by the miner on its node);
    None: no teacher. A one-label sequence classifier (sentence-transformers' ``CrossEncoder``)
    is read as a cross-encoder (its raw logit), any other folder as a bi-encoder (the cosine of
    its embeddings, pooled as the folder says: a folder our jobs export, or a
    sentence-transformers folder)."""
    denoise_margin: float | None = None
    """Drop a mined negative the teacher scores at or above its score of the row's positive
    less this margin (RocketQA's denoising; a drop is refilled from deeper ranks of the
    window). None: no denoising."""
    temperature: float | None = None
    """Where its scores are distilled (``train.distill_weight``), they are read as logits at
    this temperature, as the student's cosines are at ``train.temperature``: ``kl`` takes the
    softmax of score / temperature, ``margin_mse`` compares margins on one scale. None: the
    job sets it from the teacher's kind: ``train.temperature`` for a bi-encoder (its scores are
    cosines, as the student's are), 1 for a cross-encoder (its scores are logits already)."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            (
                "mining.teacher.denoise_margin",
                self.denoise_margin is None or self.model is not None,
                "needs mining.teacher.model",
            ),
            (
                "mining.teacher.temperature",
                self.temperature is None or (self.model is not None and self.temperature > 0),
                "must be > 0, with mining.teacher.model",
            ),
        ]


@dataclass
class MiningSection:
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
    """``top``: each anchor's nearest ``num_negatives`` candidates that pass the filters.
    ``random``: a seeded uniform draw of ``num_negatives`` among every candidate that passes in
    the rank window (``range_min`` .. ``range_max``, else ``top_k``), as sentence-transformers
    draws; in the pairs task a refresh keeps the window's survivors and every epoch draws anew
    (FlagEmbedding's ``train_group_size`` over ``hn_mine``'s ``range_for_sampling``), so a run
    that mines once still trains on varied negatives."""
    index: Literal["auto", "flat", "ivf", "ivfpq"] = "auto"
    """``auto``: exact flat search up to 50,000 vectors on a CPU (2,000,000 where the search
    runs on a GPU), IVF above; the IVF settings follow the corpus size
    (``pipeline.mining.index``, from docs/benchmarks.md: Mining refresh at scale)."""
    shards: int | None = None
    """Miner shards: 1 keeps every text's vector and the index in the miner actor (its one
    shard runs there, the same code as N's). N splits them
    over N shard actors, each with ``num_cpus`` and ``num_gpus`` on a node ``label_selector``
    matches, beside the miner (which then holds only each text's key and the rows, and no GPU):
    each shard encodes its range of the corpus with the newest weights and indexes its
    candidates, and every search runs on all of them, their top lists merged (exactly one
    index's result with flat indexes). ``None``: chosen when the job starts, from the cluster:
    with ``num_gpus`` > 0, one shard per ``num_gpus`` of the GPUs beyond the train workers'
    (ANCE's inference GPUs beside the training ones); on CPUs, 1 (set N when the vectors and
    the index outgrow one node: the refresh's index line gives their size)."""
    num_cpus: float = 1.0
    """CPUs for the miner actor (and for each shard actor)."""
    num_gpus: float = 0.0
    """GPUs for the miner actor (and for each shard actor); with a GPU it encodes there and
    searches with a GPU index."""
    label_selector: dict[str, str] = field(default_factory=dict)
    """Ray node labels the miner (and each shard actor) must run on, as
    ``train.label_selector`` for the workers: e.g. a node group of inference GPUs beside the
    training ones, or on-demand nodes for the one actor a refresh depends on. Empty: any
    node with the resources."""
    batch_sampler: SamplerName = "random"
    """How a refreshed epoch's rows are grouped into batches (the corpus task); every
    sampler covers each row once, in balanced batches, and keeps flagged false negatives
    apart. ``random`` (the default, because no sampler has yet beaten it on dev scores by
    more than the seed spread: docs/results.md): random batches, and no miner unless
    ``refresh`` asks for one (it then keeps each row's flagged false negatives apart and
    measures the batches: ``mining/`` metrics).
    ``knn``: each batch grown from a seed row's nearest neighbours (Prim's order), the
    BatchSampler paper's kNN baseline. See docs/results.md for what each measured."""
    random_negatives: int = 0
    """Pairs task: random negatives added per anchor beside its ``num_negatives`` mined
    ones (drawn from the positives' pool, duplicates of the anchor and positive excluded);
    mixing is what worked in tevatron #43."""
    refresh: Literal["every_epoch", "every_epoch_async", "once", "never"] | None = None
    """When negatives are mined (:attr:`~pipeline.config.schema.Config.refresh` resolves
    ``None``). Pairs task: ``once`` (its default): before epoch 1 with the starting model
    (static, as sentence-transformers' ``mine_hard_negatives`` does); later epochs reshuffle the
    rows and keep their negatives. On Twitter URL it scored level with refreshing after every
    epoch, on the dev set and on the 33k-tweet distractor set, 3 seeds each, at less time
    (docs/results.md). ``every_epoch``: the same, then again at every epoch boundary with the
    newest weights (ANCE), while training waits. ``every_epoch_async``: the same, but a
    boundary's refresh runs while training goes on, from weights ``max_staleness_steps`` before
    the boundary; training never waits for it. ``never``: no mining (the given negatives and
    in-batch negatives only).
    Corpus task: ``every_epoch``, ``every_epoch_async`` or ``never`` (its epoch 1 is always
    random). Its default follows ``batch_sampler``: ``every_epoch`` for ``knn`` batches, which
    need the newest neighbours; ``never`` for ``random`` batches, where the miner would only
    keep each row's nearest rows out of its batch, which measured no better than no miner
    (docs/results.md, the Wikipedia sentences, 3 seeds)."""
    teacher: TeacherSection = field(default_factory=TeacherSection)
    max_staleness_steps: int = 50
    """``every_epoch_async``: steps before an epoch's end at which the weights are snapshotted for the refresh."""
    timeout_s: float = 3600.0
    """Longest a training worker waits for one refresh (or for the miner to come back after a
    restart) before failing with a clear error. The miner's placement at start waits
    ``train.placement_timeout_s``; a dead miner is restarted up to ``train.max_failures``
    times."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("mining.top_k", self.top_k >= 1, "must be >= 1"),
            (
                "mining.relative_margin",
                self.relative_margin is None or 0 <= self.relative_margin < 1,
                "must be in [0, 1)",
            ),
            ("mining.num_negatives", self.num_negatives >= 1, "must be >= 1"),
            (
                "mining.shards",
                self.shards is None or self.shards >= 1,
                "must be >= 1 (or null: from the cluster)",
            ),
            ("mining.num_cpus", self.num_cpus >= 0, "must be >= 0"),
            ("mining.num_gpus", self.num_gpus >= 0, "must be >= 0"),
            ("mining.timeout_s", self.timeout_s > 0, "must be > 0"),
            ("mining.max_staleness_steps", self.max_staleness_steps >= 0, "must be >= 0"),
            ("mining.random_negatives", self.random_negatives >= 0, "must be >= 0"),
            *self.teacher.checks(),
        ]
