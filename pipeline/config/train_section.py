"""The ``train`` and ``checkpoint`` sections: how the workers train (batch, optimizer, loss,
resources, failures, compilation) and how often they save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.check import Check

CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

CONTRASTIVE_DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
"""The interaction terms the contrastive loss can put in one softmax (``train.directions``), in
sentence-transformers' names (``MultipleNegativesRankingLoss(directions=...)``);
``query_to_doc`` is InfoNCE's own."""

INFONCE_DIRECTIONS = ("query_to_doc",)
"""``train.directions``' default: InfoNCE's term alone."""

DIRECTIONS_RULE = f"must include query_to_doc and be distinct names of {', '.join(CONTRASTIVE_DIRECTIONS)}"
"""What :func:`valid_directions` asks, as the config, the loss and the bench's peer say it."""


def valid_directions(directions: tuple[str, ...] | list[str]) -> bool:
    """Whether ``directions`` are distinct names of :data:`CONTRASTIVE_DIRECTIONS` including
    ``query_to_doc`` (:data:`DIRECTIONS_RULE`)."""
    return (
        "query_to_doc" in directions
        and set(directions) <= set(CONTRASTIVE_DIRECTIONS)
        and len(set(directions)) == len(directions)
    )


LENGTH_GROUP_BATCHES = 50
"""Batches per length-sorted group with ``train.group_by_length``: Hugging Face's megabatch
(``LengthGroupedSampler``). Larger groups mean less padding but narrower length ranges inside
a batch, so in-batch negatives of ever more similar length; 50 keeps padding low at batch 64
(docs/benchmarks.md, Length-grouped batches) without tuning it per run."""


@dataclass
class TrainSection:
    epochs: int = 1
    batch_size: int = 64
    """Global batch size: sentences per optimizer step across all workers. Every sentence in
    it is a negative for every other."""
    lr: float = 3e-5
    """Peak learning rate of AdamW (SimCSE: 3e-5 for BERT-base, 1e-5 for BERT-large)."""
    weight_decay: float = 0.0
    """AdamW weight decay (SimCSE uses none)."""
    warmup_ratio: float = 0.0
    """Share of all steps spent warming the learning rate up linearly; it then decays linearly to 0."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm before each step."""
    temperature: float = 0.05
    """InfoNCE temperature (SimCSE's 0.05)."""
    num_workers: int = 1
    """Ray Train workers (DDP ranks); each holds a slice of every global batch."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each worker."""
    gpus_per_worker: float = 0.0
    """GPUs Ray reserves for each worker; above 0 the workers train on GPUs (bf16 autocast,
    fused AdamW), 0 on CPUs. At most 1: a worker's model sits on one device (data parallel,
    Ray Train's convention), so more GPUs are had with more workers (``train.num_workers``); a
    second GPU reserved per worker would idle. A fraction packs workers (and a miner with a
    fractional ``mining.num_gpus``) onto one GPU; see :attr:`backend`."""
    label_selector: dict[str, str] = field(default_factory=dict)
    """Ray node labels the workers must run on (Ray's label selectors: ``value``, ``!value``,
    ``in(a,b)``), e.g. ``{ray.io/node-group: gpu-train}`` on KubeRay, or
    ``{ray.io/market-type: on-demand}``; each start and restart of the workers waits for such a
    node. Empty: any node with the resources."""
    log_every: int = 10
    """Steps between MLflow metric flushes from rank 0."""
    hard_negative_weight: float = 0.0
    """Pairs task: added to the logit of a row's own hard negatives (SimCSE's weight)."""
    hardness_strength: float = 0.0
    """Pairs task: hardness weighting of a row's own hard negatives (Lan et al. 2025, Eq. 5,
    as EmbeddingGemma applies it; sentence-transformers' ``hardness_strength`` with
    ``hardness_mode="hard_negatives"``): ``hardness_strength`` x each negative's cosine
    (no gradient through it) is added to its logit, so the harder of them weigh more. 0
    turns it off; sentence-transformers measured 2 best (EmbeddingGemma uses 5)."""
    directions: list[str] = field(default_factory=lambda: list(INFONCE_DIRECTIONS))
    """The contrastive loss's terms, one softmax a row (:data:`CONTRASTIVE_DIRECTIONS`;
    sentence-transformers' ``directions`` with ``partition_mode="joint"``): ``query_to_doc``
    (InfoNCE, always), ``doc_to_query`` (each positive against every anchor: the symmetric
    term), ``query_to_query`` and ``doc_to_doc`` (anchors against anchors, positives against
    positives and negatives); all four are GTE's improved contrastive loss (Li et al. 2023). In
    the corpus task the anchor and positive are a sentence's two views."""
    dup_rate: float = 0.0
    """ESimCSE word repetition on the second view (0.32 in ESimCSE); 0 turns it off."""
    mlm_weight: float = 0.0
    """Corpus task: SimCSE's auxiliary masked-language-model objective (the reference's
    ``do_mlm``; it uses 0.1): each view is BERT-masked (15% of its tokens) and a training-only
    MLM head predicts them; the loss is InfoNCE + ``mlm_weight`` x their cross-entropy. The
    paper found it lowers STS slightly and helps transfer tasks. 0 turns it off."""
    distill_weight: float = 0.0
    """Pairs task with ``mining.teacher.model``: the loss is InfoNCE + ``distill_weight`` x the
    distillation of the teacher's scores of each row's positive and mined negatives
    (``distill_loss``). 0 turns it off."""
    distill_loss: Literal["kl", "margin_mse"] = "kl"
    """``kl``: KL between the teacher's and the student's softmax over a row's positive and
    negatives, both at ``train.temperature`` (sentence-transformers' ``DistillKLDivLoss`` without
    its T², so that a weight of 1 is InfoNCE's scale): for a
    bi-encoder teacher, whose scores are cosines as the student's are; ``margin_mse``: the
    squared error of the student's positive-negative margins against the teacher's (its
    ``MarginMSELoss``), which a cross-encoder's logits suit."""
    max_failures: int = 3
    """Worker-group failures (a dead worker, a lost node) Ray Train recovers from, each time
    restarting every worker from the latest checkpoint; also the times a dead miner actor is
    restarted (it then re-mines from the newest weights). -1: no limit; 0: fail at once."""
    placement_timeout_s: float = 600.0
    """Longest to wait for the train workers' resources (each start and restart) and for the
    miner actor to be placed and load its inputs, before failing with an error that names
    what could not be placed."""
    group_by_length: bool | None = None
    """Random batches (epoch 1, every epoch when mining is off, and the pairs task's plans) are
    drawn from groups of :data:`LENGTH_GROUP_BATCHES` batches sorted by token length, so a
    batch carries little padding. Mined neighbourhood plans keep their own grouping. ``None``
    (:meth:`~pipeline.config.schema.Config.groups_by_length` resolves it): on for pairs that
    carry no hard negative (no mining, no given negatives), off otherwise. On Twitter URL, 3
    seeds, grouping raised in-batch-only training by 0.29 ± 0.15 nDCG@10 in 0.72x the time and
    lowered mined-once training by 0.50 ± 0.33 (docs/results.md); the corpus task's one
    measurement (STS-B, 2 seeds, 1 epoch: docs/benchmarks.md, Length-grouped batches) showed
    no difference in quality, too little to change its default."""
    mini_batch_size: int = 0
    """Above 0, a worker's training passes run in pieces of this many texts, each run again in
    the backward pass (activation checkpointing), so activation memory is one piece's whatever
    ``batch_size`` and ``mining.num_negatives`` are, for one more forward pass a step
    (sentence-transformers' ``mini_batch_size`` of its cached losses; the gradient is
    unchanged). 0: the whole share at once."""
    compile: CompileMode = "off"
    """``torch.compile`` the model in each worker (in place) in this mode; ``off``: eager.
    Faster GPU steps for a compile at start, and each new batch width may compile again, so
    it pays off on long runs; see docs/benchmarks.md (Per-worker compute: base BERT on one
    H100). ``reduce-overhead`` uses CUDA graphs: one launch for the step's many small kernels,
    which bound a batch-64 step on a GPU; a graph per batch width. Needs a working C++
    compiler on CPU."""

    @property
    def use_gpu(self) -> bool:
        """Whether the workers train on GPUs: exactly when each reserves some."""
        return self.gpus_per_worker > 0

    @property
    def backend(self) -> str:
        """The workers' collective backend: NCCL when each rank owns a GPU (or there is one
        rank), else gloo, which also reduces CUDA tensors. Ray packs fractional workers onto
        one GPU, and NCCL refuses two ranks on one device ("Duplicate GPU detected",
        ray-project/ray#48012)."""
        own_gpu = self.gpus_per_worker >= 1 or self.num_workers == 1
        return "nccl" if self.use_gpu and own_gpu else "gloo"

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("train.temperature", self.temperature > 0, "must be > 0"),
            ("train.epochs", self.epochs >= 1, "must be >= 1"),
            ("train.batch_size", self.batch_size >= 2, "must be >= 2 (in-batch negatives)"),
            ("train.lr", self.lr > 0, "must be > 0"),
            ("train.warmup_ratio", 0 <= self.warmup_ratio < 1, "must be in [0, 1)"),
            ("train.max_grad_norm", self.max_grad_norm > 0, "must be > 0"),
            ("train.num_workers", self.num_workers >= 1, "must be >= 1"),
            ("train.cpus_per_worker", self.cpus_per_worker > 0, "must be > 0"),
            (
                "train.gpus_per_worker",
                0 <= self.gpus_per_worker <= 1,
                "must be in [0, 1]: a worker trains on one GPU (its model is not split over "
                "devices); for more GPUs raise train.num_workers",
            ),
            ("train.log_every", self.log_every >= 1, "must be >= 1"),
            ("train.dup_rate", 0 <= self.dup_rate <= 1, "must be in [0, 1]"),
            ("train.mlm_weight", self.mlm_weight >= 0, "must be >= 0"),
            ("train.mini_batch_size", self.mini_batch_size >= 0, "must be >= 0 (0: no pieces)"),
            ("train.distill_weight", self.distill_weight >= 0, "must be >= 0"),
            ("train.hardness_strength", self.hardness_strength >= 0, "must be >= 0"),
            ("train.directions", valid_directions(self.directions), DIRECTIONS_RULE),
            ("train.max_failures", self.max_failures >= -1, "must be >= -1 (-1: no limit)"),
            ("train.placement_timeout_s", self.placement_timeout_s > 0, "must be > 0"),
            (
                "train.batch_size",
                self.batch_size >= 2 * self.num_workers,
                f"must be >= 2 x train.num_workers ({2 * self.num_workers}) so every worker gets rows",
            ),
        ]


@dataclass
class CheckpointSection:
    every_steps: int = 0
    """Also checkpoint every N optimizer steps inside an epoch, so a failure costs at most N
    steps instead of an epoch. 0: at epoch ends only."""
    keep_last: int = 2
    """Checkpoints kept in the storage path: the newest N (older ones are deleted). The best
    evaluated model travels inside every checkpoint, so pruning never loses it."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("checkpoint.every_steps", self.every_steps >= 0, "must be >= 0"),
            ("checkpoint.keep_last", self.keep_last >= 1, "must be >= 1"),
        ]
