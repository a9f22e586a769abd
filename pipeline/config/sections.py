"""The config's sections: one dataclass each, with defaults and a docstring per key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


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


@dataclass
class GeneratedCorpusSection:
    """A synthetic corpus of paraphrase groups, used when ``data.path`` is unset."""

    num_groups: int = 300
    group_size: int = 4
    seed: int = 0
    sts_pairs: int = 0
    """Also write an STS file of this many scored pairs over the generated sentences and
    evaluate on it first (before any ``eval.sts`` files). 0: none."""


@dataclass
class DataSection:
    path: str | None = None
    """Corpus file, directory or URI. ``None`` generates a corpus (see ``data.generated``)."""
    format: Literal["auto", "text", "csv", "tsv", "jsonl", "parquet"] = "auto"
    text_column: str = "text"
    """Column holding the sentence for csv/tsv/jsonl/parquet."""
    anchor_column: str = "anchor"
    """Pair inputs (``jobs/mine.py``): the anchor column."""
    positive_column: str = "positive"
    """Pair inputs: the positive column."""
    negative_column: str | None = None
    """Triplet inputs: a column of given hard negatives (e.g. NLI contradictions); empty
    cells mean none for that row."""
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


@dataclass
class TinyModelSection:
    """Shape of the randomly initialised BERT built when ``model.name_or_path`` is unset."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 2000


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


@dataclass
class TrainSection:
    epochs: int = 1
    batch_size: int = 64
    """Global batch size: sentences per optimizer step across all workers. Every sentence in
    it is a negative for every other."""
    lr: float = 3e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    max_grad_norm: float = 1.0
    temperature: float = 0.05
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    use_gpu: bool = False
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
    carries little padding. Mined neighbourhood plans keep their own grouping. Measured
    effect on speed and STS-B in docs/benchmarks.md."""
    length_group_batches: int = 50
    """Batches per length-sorted group (Hugging Face's megabatch is 50): larger groups mean
    less padding and narrower length ranges inside a batch."""
    compile: bool = False
    """``torch.compile`` the model in each worker (in place). On a GPU it cut a BERT-base step
    by 18-21% after 35-45 s of compiling (docs/benchmarks.md); each new batch width may
    compile again, so it pays off on long runs. Needs a working C++ compiler on CPU."""

    @property
    def group_batches(self) -> int:
        """Batches per length-sorted group of a random plan; 0 when grouping is off."""
        return self.length_group_batches if self.group_by_length else 0


@dataclass
class MiningSection:
    enabled: bool = True
    """Refresh the batch plan from the newest weights between epochs (epoch 1 is random)."""
    top_k: int = 64
    """Neighbours searched per row (the candidate list every filter works on)."""
    range_min: int = 10
    """Skip this many nearest candidates of those the other filters left (sentence-transformers'
    order): the top ranks of a natural corpus are mostly paraphrases, i.e. false negatives.
    10 is where FlagEmbedding's hn_mine window starts and what the sentence-transformers
    mining example uses."""
    range_max: int | None = None
    """Consider candidates ranked below this only (``None``: all ``top_k``)."""
    max_score: float | None = None
    """Drop candidates more similar than this to the anchor."""
    relative_margin: float | None = 0.05
    """Keep a candidate only if sim <= pos - |pos| x margin, pos = sim(anchor, positive);
    NV-Retriever's 0.05."""
    num_negatives: int = 1
    """Negatives per anchor (offline mining and triplet mode)."""
    sampling: Literal["top", "random"] = "top"
    index: Literal["auto", "flat", "ivf", "ivfpq"] = "auto"
    """``auto``: exact flat search up to ``flat_max_rows`` vectors, IVF above."""
    flat_max_rows: int = 50_000
    """Largest corpus ``auto`` searches exactly. All-rows flat search grows as n^2: on two
    CPU cores, 384-dimensional vectors took 12.5 s flat against 7.6 s IVF at 50k and 52 s
    against 21 s at 100k (recall@10 of IVF 0.99-1.0). GPU clusters can raise it (a flat GPU
    search of 1M rows takes seconds)."""
    nlist: int | None = None
    """IVF cells (``None``: 4 x sqrt(rows))."""
    nprobe: int = 32
    """IVF cells searched per query: recall >= 0.95 on clustered data at the default."""
    pq_m: int = 16
    """Bytes per vector for ``ivfpq``."""
    encode_batch_size: int = 64
    """Sentences per encode batch in the miner: 64 is the fastest measured on CPU; a GPU wants
    512 or more (``jobs/configs/cluster-gpu.yaml`` sets 1024)."""
    encode_actors: int = 0
    """0: the miner actor encodes the corpus itself. N: the re-encode fans out over a Ray
    Data pool of up to N actors (each with ``encode_num_cpus``/``encode_num_gpus``); they
    need resources beyond those the train workers and the miner hold."""
    encode_num_cpus: float = 1.0
    encode_num_gpus: float = 0.0
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    """GPUs for the miner actor; with a GPU it encodes there and searches with a GPU index."""
    negative_mode: Literal["neighbourhood", "triplet"] = "neighbourhood"
    """``neighbourhood`` (unsupervised SimCSE on ``data.text_column``): each epoch's batches
    are groups of near sentences. ``triplet`` (supervised SimCSE on anchor/positive
    [/negative] columns): each anchor gets ``num_negatives`` mined negatives, used with any
    given negative and ``train.hard_negative_weight``."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: refresh at the epoch boundary while training waits. ``async``: the miner
    works while training goes on, from weights at most ``max_staleness_steps`` old at the
    boundary; training never waits for it."""
    max_staleness_steps: int = 50
    """Async: steps before an epoch's end at which the weights are snapshotted for the refresh."""
    timeout_s: float = 3600.0
    """Longest a training worker waits for one refresh (or for the miner actor to be placed,
    or to come back after a restart) before failing with a clear error."""
    max_restarts: int = 3
    """Times a dead miner actor is restarted (it then re-mines from the newest weights)
    before the job fails."""

    def index_spec(
        self,
    ):  # -> pipeline.mining.index.IndexSpec (imported lazily: config stays dependency-free)
        from pipeline.mining.index import IndexSpec

        return IndexSpec(self.index, self.flat_max_rows, self.nlist, self.nprobe, self.pq_m)

    def negative_filters(self):  # -> pipeline.mining.negatives.NegativeFilters
        from pipeline.mining.negatives import NegativeFilters

        return NegativeFilters(
            self.range_min,
            self.range_max,
            self.max_score,
            self.relative_margin,
            self.num_negatives,
            self.sampling,
        )


@dataclass
class CheckpointSection:
    every_steps: int = 0
    """Also checkpoint every N optimizer steps inside an epoch, so a failure costs at most N
    steps instead of an epoch. 0: at epoch ends only."""
    keep_last: int = 2
    """Checkpoints kept in the storage path: the newest N (older ones are deleted). The best
    evaluated model travels inside every checkpoint, so pruning never loses it."""


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
    """Gold score from which an STS pair counts as a positive for the alignment metric."""
    whitening: bool = False
    """Fit BERT-whitening on corpus embeddings at each evaluation, report STS with and without
    it, pick the best checkpoint by the whitened score and export the whitening layer."""
    whitening_dim: int | None = None
    """Keep the first k whitened dimensions (``None``: all)."""
    whitening_rows: int = 10_000
    """Corpus sentences (a fixed random sample) the whitening is fitted on."""


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
    utilisation and memory where ``nvidia-ml-py`` is installed) from every node that runs
    training workers, so a reviewer sees whether the hardware was busy."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system-metric samples."""
