"""The config's sections: one dataclass each, with defaults, a docstring per key, and the
rules its values must follow (``checks()``). ``mining`` has a module of its own
(:mod:`pipeline.config.mining_section`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Check = tuple[str, bool, str]
"""One validation rule of a section: ``(dotted key, holds, what the value must be)``;
:meth:`pipeline.config.schema.Config.validate` raises for the first that does not hold."""


@dataclass
class RunSection:
    name: str | None = None
    """Run name. A job started again with the same name resumes that run's latest checkpoint
    and continues its MLflow run. ``None`` generates a fresh name."""
    output_dir: str = "runs"
    """Local folder for the run's files: ``output_dir/name/model`` (the exported model), the
    initial model and a generated corpus."""
    storage_path: str | None = None
    """Where Ray Train keeps checkpoints (``storage_path/name``): a local folder or any pyarrow
    filesystem URI (``s3://...``, ``gs://...``). Must be shared storage on a multi-node
    cluster. ``None``: ``output_dir``."""
    seed: int = 42

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        valid = self.name is None or (bool(self.name) and all(c.isalnum() or c in "-_." for c in self.name))
        return [("run.name", valid, "may hold only letters, digits, '-', '_' and '.'")]


@dataclass
class RaySection:
    address: str | None = None
    """Cluster to join. ``None``: ``RAY_ADDRESS`` if set (as under ``ray job submit``), else start
    a local Ray."""
    connect_timeout_s: float = 30.0
    """How long a job waits for the cluster at ``ray.address`` / ``RAY_ADDRESS`` to answer
    before failing with one line (Ray's own client would retry for many minutes)."""
    num_cpus: float | None = None
    """Logical CPUs of a locally started Ray (``None``: the machine's count)."""
    progress_bars: bool = False
    """Ray Data progress bars; off by default so logs stay readable."""
    dashboard_host: str = "127.0.0.1"
    """Interface the dashboard of a locally started Ray listens on. Loopback keeps it (and its
    job-submission API, which runs arbitrary code) off the network; set ``0.0.0.0`` only
    behind a firewall or with Ray token auth on."""
    train_log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "CRITICAL"
    """Ray Train's own console logs. Its failure reports carry full tracebacks, so they are
    off by default: the job prints one line per worker failure and one for the final error.
    ``--debug`` sets ``INFO``. Ray Train's log files in the Ray session's ``logs/train`` keep
    every level either way."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [("ray.connect_timeout_s", self.connect_timeout_s > 0, "must be > 0")]


@dataclass
class GeneratedCorpusSection:
    """A synthetic corpus of paraphrase groups, used when ``data.path`` is unset."""

    num_groups: int = 300
    """Paraphrase groups: sentences of one group share most of their words."""
    group_size: int = 4
    """Sentences per group (the corpus has ``num_groups x group_size`` before dedup)."""
    seed: int = 0
    """Seed of the generator (vocabulary, groups, noise)."""
    sts_pairs: int = 0
    """Also write an STS file of this many scored pairs over the generated sentences and
    evaluate on it first (before any ``eval.sts`` files). 0: none."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("data.generated.num_groups", self.num_groups >= 1, "must be >= 1"),
            ("data.generated.group_size", self.group_size >= 1, "must be >= 1"),
            ("data.generated.sts_pairs", self.sts_pairs >= 0, "must be >= 0"),
        ]


@dataclass
class DataSection:
    path: str | None = None
    """Corpus file, directory or URI. ``None`` generates a corpus (see ``data.generated``)."""
    format: Literal["auto", "text", "csv", "tsv", "jsonl", "parquet", "pairs_tsv"] = "auto"
    """``auto`` (by extension), ``text``, ``csv``, ``tsv``, ``jsonl``, ``parquet``, or
    ``pairs_tsv``: pairs without a header, tab-separated, no quoting, 2 or 3 fields per line
    (sentence1, sentence2[, label]), as STS-B and the Twitter URL corpus are written."""
    text_column: str = "text"
    """Column holding the sentence for csv/tsv/jsonl/parquet."""
    anchor_column: str = "anchor"
    """Pair inputs (``jobs/mine.py``): the anchor column."""
    positive_column: str = "positive"
    """Pair inputs: the positive column."""
    negative_column: str | None = None
    """Triplet inputs: a column of given hard negatives (e.g. NLI contradictions); empty
    cells mean none for that row."""
    label_column: str | None = None
    """Pair inputs: a column of labels, 1 (the row is an (anchor, positive) pair) or 0 (its
    second text is a given negative of its anchor). ``pairs_tsv`` files: the third field."""
    given_negatives: bool = True
    """Pair inputs: train on given negatives (label-0 rows, or ``negative_column``); false
    leaves them out."""
    pool: str | None = None
    """Pair inputs: a corpus (file, folder or URI) whose distinct texts, with the distinct
    positives, are the candidates negatives are mined from. ``None``: the distinct positives."""
    pool_format: Literal["auto", "text", "csv", "tsv", "jsonl", "parquet", "pairs_tsv"] = "auto"
    """Format of ``pool``, as ``format`` (``pairs_tsv``: every sentence2 of the file)."""
    pool_text_column: str = "text"
    """The text column of a csv/tsv/jsonl/parquet ``pool``."""
    max_seq_len: int = 32
    max_rows: int | None = None
    """Train on at most this many rows: for a text corpus a fixed pseudo-random sample of the
    distinct sentences (the first by content hash), for pair files the first rows. ``None``: all."""
    tokenize_batch_size: int = 1024
    tokenize_num_cpus: float = 0.25
    """CPUs reserved per Ray Data cleaning task and tokenizer actor (fractions work on small
    machines)."""
    tokenize_actors: int = 2
    """Most tokenizer actors in the Ray Data pool. Each loads the tokenizer once; raise it
    with the cluster's CPUs."""
    generated: GeneratedCorpusSection = field(default_factory=GeneratedCorpusSection)

    def checks(self) -> list[Check]:
        """This section's rules, ``data.generated``'s included (see :data:`Check`)."""
        return [
            ("data.max_seq_len", self.max_seq_len >= 4, "must be >= 4"),
            ("data.max_rows", self.max_rows is None or self.max_rows >= 1, "must be >= 1"),
            (
                "data.negative_column",
                not (self.negative_column and self.label_column),
                "must be unset with data.label_column (label-0 rows are the given negatives)",
            ),
            ("data.tokenize_batch_size", self.tokenize_batch_size >= 1, "must be >= 1"),
            ("data.tokenize_num_cpus", self.tokenize_num_cpus > 0, "must be > 0"),
            ("data.tokenize_actors", self.tokenize_actors >= 1, "must be >= 1"),
            *self.generated.checks(),
        ]


@dataclass
class TinyModelSection:
    """Shape of the randomly initialised BERT built when ``model.name_or_path`` is unset: small
    enough that tests and the demo train in seconds on a CPU."""

    hidden_size: int = 64
    """Width of the embeddings, and so of the sentence vectors the index holds."""
    num_layers: int = 2
    """Transformer layers."""
    num_heads: int = 2
    """Attention heads per layer; must divide ``hidden_size``."""
    intermediate_size: int = 128
    """Width of each layer's feed-forward block."""
    vocab_size: int = 2000
    """Largest WordPiece vocabulary trained on the corpus (fewer when the corpus is small)."""


@dataclass
class ModelSection:
    name_or_path: str | None = None
    """HF hub name or model directory. ``None`` builds a tiny BERT and trains a WordPiece
    tokenizer on the corpus (no network needed)."""
    pooler: Literal["cls", "cls_before_pooler", "mean"] = "cls"
    mlp: bool | None = None
    """SimCSE's MLP head over the pooled output, used in training only. ``None``: on for ``cls``."""
    dropout: float = 0.1
    """Hidden and attention dropout: the only augmentation in unsupervised SimCSE."""
    tiny: TinyModelSection = field(default_factory=TinyModelSection)

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [("model.dropout", 0 <= self.dropout < 1, "must be in [0, 1)")]


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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
    use_gpu: bool = False
    """Train on GPUs (``gpus_per_worker`` each), bf16 autocast and fused AdamW."""
    gpus_per_worker: float = 1.0
    """GPUs Ray reserves for each worker when ``use_gpu``. A fraction packs workers (and a
    miner with a fractional ``mining.num_gpus``) onto one GPU; see :attr:`backend`."""
    log_every: int = 10
    """Steps between MLflow metric flushes from rank 0."""
    hard_negative_weight: float = 0.0
    """Triplet mode: added to the logit of a row's own hard negatives (SimCSE's weight)."""
    dup_rate: float = 0.0
    """ESimCSE word repetition on the second view (0.32 in ESimCSE); 0 turns it off."""
    max_failures: int = 3
    """Worker-group failures (a dead worker, a lost node) Ray Train recovers from, each time
    restarting every worker from the latest checkpoint. -1: no limit; 0: fail at once."""
    placement_timeout_s: float = 600.0
    """Longest to wait for the train workers' resources (each start and restart) before
    failing with an error that names what could not be placed."""
    group_by_length: bool = False
    """Random batches (epoch 1, every epoch when mining is off, and triplet mode's plans) are
    drawn from groups of ``length_group_batches`` batches sorted by token length, so a batch
    carries little padding. Mined neighbourhood plans keep their own grouping. Effect on
    speed and STS-B: see docs/benchmarks.md (Length-grouped batches)."""
    length_group_batches: int = 50
    """Batches per length-sorted group (Hugging Face's megabatch is 50): larger groups mean
    less padding and narrower length ranges inside a batch."""
    peak_tflops: float | None = None
    """Peak dense bf16 TFLOP/s of one worker's device, for the ``train/mfu`` metric. Unset:
    NVIDIA's datasheet figure on an H100/H200, and no MFU on other devices."""
    compile: bool = False
    """``torch.compile`` the model in each worker (in place). Faster GPU steps for a compile
    at start, and each new batch width may compile again, so it pays off on long runs; see
    docs/benchmarks.md (Per-worker compute: base BERT on one H100). Needs a working C++ compiler on CPU."""
    compile_mode: str = "default"
    """``torch.compile``'s mode with ``compile``: ``default``, ``reduce-overhead`` (CUDA graphs:
    one launch for the step's many small kernels, which bounds a batch-64 step on a GPU; a
    graph per batch width), ``max-autotune`` or ``max-autotune-no-cudagraphs``."""

    @property
    def backend(self) -> str:
        """The workers' collective backend: NCCL when each rank owns a GPU (or there is one
        rank), else gloo, which also reduces CUDA tensors. Ray packs fractional workers onto
        one GPU, and NCCL refuses two ranks on one device ("Duplicate GPU detected",
        ray-project/ray#48012)."""
        own_gpu = self.gpus_per_worker >= 1 or self.num_workers == 1
        return "nccl" if self.use_gpu and own_gpu else "gloo"

    @property
    def group_batches(self) -> int:
        """Batches per length-sorted group of a random plan; 0 when grouping is off."""
        return self.length_group_batches if self.group_by_length else 0

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
                self.gpus_per_worker > 0
                and (self.gpus_per_worker <= 1 or float(self.gpus_per_worker).is_integer()),
                "must be > 0, and a whole number above 1 (Ray does not split a worker over part-GPUs)",
            ),
            ("train.log_every", self.log_every >= 1, "must be >= 1"),
            ("train.dup_rate", 0 <= self.dup_rate <= 1, "must be in [0, 1]"),
            (
                "train.length_group_batches",
                self.length_group_batches >= 2,
                "must be >= 2 (batches sorted together)",
            ),
            ("train.max_failures", self.max_failures >= -1, "must be >= -1 (-1: no limit)"),
            ("train.placement_timeout_s", self.placement_timeout_s > 0, "must be > 0"),
            ("train.peak_tflops", self.peak_tflops is None or self.peak_tflops > 0, "must be > 0 (or unset)"),
            (
                "train.compile_mode",
                self.compile_mode in COMPILE_MODES,
                f"must be one of {', '.join(COMPILE_MODES)}",
            ),
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


@dataclass
class EvalSection:
    sts: list[str] = field(default_factory=list)
    """STS files evaluated at the start, at every epoch end and every ``every_steps`` (Spearman
    x 100 of cosine similarity). The first one picks the best checkpoint, which is what the
    job exports. Empty: no evaluation, and the last epoch is exported."""
    format: Literal["auto", "stsb", "cnsd", "csv", "tsv", "jsonl"] = "auto"
    """Format of every ``eval.sts`` file (``auto`` tells them apart by name and first line)."""
    every_steps: int = 0
    """Also evaluate every N optimizer steps. Any evaluation can pick the exported model, not
    only epoch ends. 0: off."""
    batch_size: int = 128
    positive_threshold: float = 4.0
    """Gold score from which an STS pair counts as a positive: for the alignment metric, and as
    a paraphrase-retrieval query (its first sentence must find its second among every
    sentence of the file: ``mrr_at_10``, ``recall_at_1``)."""
    whitening: bool = False
    """Fit BERT-whitening on corpus embeddings at each evaluation, report STS with and without
    it, pick the best checkpoint by the whitened score and export the whitening layer."""
    whitening_dim: int | None = None
    """Keep the first k whitened dimensions (``None``: all)."""
    whitening_rows: int = 10_000
    """Corpus sentences (a fixed random sample) the whitening is fitted on."""
    retrieval: list[str] = field(default_factory=list)
    """Retrieval sets evaluated with the STS files (nDCG@10, MRR@10, Recall@1/@10/@100 x 100 of
    cosine similarity, logged as ``eval/retrieval_<set>_ndcg_at_10`` ...): BEIR folders
    (``queries.jsonl``, ``corpus.jsonl``, ``qrels/dev.tsv`` or the only ``qrels/*.tsv``;
    ``FOLDER#SPLIT`` names another) or pair files (``sentence1``, ``sentence2``, ``label`` 0/1:
    a headerless unquoted ``.tsv``, or ``.csv``/``.jsonl``/``.parquet``). Without ``eval.sts``
    the first set's nDCG@10 picks the exported model."""
    select_by: str | None = None
    """The metric that picks the exported model, as logged without ``eval/``:
    ``sts_<file>_{spearman,spearman_whitened,mrr_at_10,recall_at_1}`` or
    ``retrieval_<set>_{ndcg_at_10,mrr_at_10,recall_at_1,recall_at_10,recall_at_100}``
    (higher is better). ``None``: the first STS file's Spearman (whitened with ``whitening``),
    else the first retrieval set's nDCG@10."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("eval.every_steps", self.every_steps >= 0, "must be >= 0"),
            ("eval.batch_size", self.batch_size >= 1, "must be >= 1"),
            ("eval.whitening_dim", self.whitening_dim is None or self.whitening_dim >= 1, "must be >= 1"),
            ("eval.whitening_rows", self.whitening_rows >= 2, "must be >= 2"),
            ("eval.retrieval", all(p.strip() for p in self.retrieval), "must not hold an empty path"),
            (
                "eval.select_by",
                self.select_by is None or _selectable(self.select_by),
                "must name a metric: sts_<file>_{"
                + ",".join(SELECTABLE_METRICS["sts"])
                + "} or retrieval_<set>_{"
                + ",".join(SELECTABLE_METRICS["retrieval"])
                + "}",
            ),
            (
                "eval.select_by",
                not (self.select_by or "").startswith("retrieval_") or bool(self.retrieval),
                "names a retrieval metric but eval.retrieval is empty",
            ),
            (
                "eval.select_by",
                not ((self.select_by or "").startswith("retrieval_") and self.whitening),
                "names a retrieval metric, which scores the plain embeddings, but eval.whitening "
                "would export a whitened model; turn one off",
            ),
        ]


SELECTABLE_METRICS = {
    "sts": ("spearman", "spearman_whitened", "mrr_at_10", "recall_at_1"),
    "retrieval": ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100"),
}
"""The metrics ``eval.select_by`` may name, per kind of set (higher is better for each)."""


def _selectable(name: str) -> bool:
    """Whether ``name`` has the form of a selectable metric: ``<kind>_<set>_<metric>``."""
    return any(
        name.startswith(f"{kind}_")
        and name.endswith(f"_{metric}")
        and len(name) > len(kind) + len(metric) + 2
        for kind, metrics in SELECTABLE_METRICS.items()
        for metric in metrics
    )


@dataclass
class TrackingSection:
    uri: str | None = None
    """MLflow tracking URI. ``MLFLOW_TRACKING_URI`` wins; default: ``sqlite:///mlruns.db`` in the
    working directory with artifacts in ``./mlartifacts``."""
    experiment: str = "simcse"
    register_as: str | None = None
    """Register the exported model in the MLflow Model Registry under this name (a new version
    per run). ``None``: log it as the run's model only."""
    connect_timeout_s: float = 15.0
    """How long the job tries to reach the tracking store at start before failing (before
    any compute)."""
    flush_every_s: float = 5.0
    """Rank 0 and the miner send buffered metrics in the background at this interval; a
    send that fails (server down) is kept and retried, so training never waits on MLflow."""
    drain_timeout_s: float = 300.0
    """At the end of training, how long unsent metrics are retried before the job gives up on
    them (saying how many) rather than on the run."""
    system_metrics: bool = True
    """Log MLflow's system metrics (``system/...``: CPU, memory, disk, network; GPU
    utilisation and memory where ``nvidia-ml-py`` is installed) from the driver's machine for
    the whole job and from every other node that runs training workers, so a reviewer sees
    whether the hardware was busy."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system-metric samples; there is also one a second after the start and
    one at the end, so a one-minute run has a handful of points and a ten-hour run 3,600."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("tracking.connect_timeout_s", self.connect_timeout_s > 0, "must be > 0"),
            ("tracking.flush_every_s", self.flush_every_s > 0, "must be > 0"),
            ("tracking.drain_timeout_s", self.drain_timeout_s >= 0, "must be >= 0"),
            ("tracking.system_metrics_interval_s", self.system_metrics_interval_s > 0, "must be > 0"),
            ("tracking.experiment", bool(self.experiment.strip()), "must not be empty"),
            (
                "tracking.register_as",
                self.register_as is None or bool(self.register_as.strip()),
                "must not be empty",
            ),
        ]
