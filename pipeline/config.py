"""Typed run configuration: defaults, YAML loading, ``--set a.b=c`` overrides, validation.

Every section is a dataclass; loading walks the YAML mapping against the dataclass fields so
that an unknown key, a value of the wrong type or an impossible value stops the job with a
:class:`ConfigError` whose message names the dotted key (``train.temperature must be > 0``).
All of this happens before Ray or MLflow are touched.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


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

    def index_spec(self):  # -> pipeline.index.IndexSpec (imported lazily: config stays dependency-free)
        from pipeline.index import IndexSpec

        return IndexSpec(self.index, self.flat_max_rows, self.nlist, self.nprobe, self.pq_m)

    def negative_filters(self):  # -> pipeline.negatives.NegativeFilters
        from pipeline.negatives import NegativeFilters

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


@dataclass
class Config:
    run: RunSection = field(default_factory=RunSection)
    ray: RaySection = field(default_factory=RaySection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    mining: MiningSection = field(default_factory=MiningSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)

    @property
    def use_mlp(self) -> bool:
        return self.model.pooler == "cls" if self.model.mlp is None else self.model.mlp

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted-key view of the whole config (for MLflow params)."""
        return flatten(self.to_dict())

    def validate(self) -> Config:
        checks: list[tuple[str, bool, str]] = [
            ("train.temperature", self.train.temperature > 0, "must be > 0"),
            ("train.epochs", self.train.epochs >= 1, "must be >= 1"),
            ("train.batch_size", self.train.batch_size >= 2, "must be >= 2 (in-batch negatives)"),
            ("train.lr", self.train.lr > 0, "must be > 0"),
            ("train.warmup_ratio", 0 <= self.train.warmup_ratio < 1, "must be in [0, 1)"),
            ("train.max_grad_norm", self.train.max_grad_norm > 0, "must be > 0"),
            ("train.num_workers", self.train.num_workers >= 1, "must be >= 1"),
            ("train.cpus_per_worker", self.train.cpus_per_worker > 0, "must be > 0"),
            ("train.log_every", self.train.log_every >= 1, "must be >= 1"),
            ("train.dup_rate", 0 <= self.train.dup_rate <= 1, "must be in [0, 1]"),
            (
                "train.length_group_batches",
                self.train.length_group_batches >= 2,
                "must be >= 2 (batches sorted together)",
            ),
            ("train.max_failures", self.train.max_failures >= -1, "must be >= -1 (-1: no limit)"),
            ("train.placement_timeout_s", self.train.placement_timeout_s > 0, "must be > 0"),
            ("checkpoint.every_steps", self.checkpoint.every_steps >= 0, "must be >= 0"),
            ("checkpoint.keep_last", self.checkpoint.keep_last >= 1, "must be >= 1"),
            ("mining.max_restarts", self.mining.max_restarts >= 0, "must be >= 0"),
            ("tracking.connect_timeout_s", self.tracking.connect_timeout_s > 0, "must be > 0"),
            ("ray.connect_timeout_s", self.ray.connect_timeout_s > 0, "must be > 0"),
            ("tracking.flush_every_s", self.tracking.flush_every_s > 0, "must be > 0"),
            ("tracking.drain_timeout_s", self.tracking.drain_timeout_s >= 0, "must be >= 0"),
            (
                "tracking.system_metrics_interval_s",
                self.tracking.system_metrics_interval_s > 0,
                "must be > 0",
            ),
            (
                "train.batch_size",
                self.train.batch_size >= 2 * self.train.num_workers,
                f"must be >= 2 x train.num_workers ({2 * self.train.num_workers}) so every worker gets rows",
            ),
            ("data.max_seq_len", self.data.max_seq_len >= 4, "must be >= 4"),
            ("data.max_rows", self.data.max_rows is None or self.data.max_rows >= 1, "must be >= 1"),
            ("data.tokenize_batch_size", self.data.tokenize_batch_size >= 1, "must be >= 1"),
            ("data.tokenize_num_cpus", self.data.tokenize_num_cpus > 0, "must be > 0"),
            ("data.tokenize_actors", self.data.tokenize_actors >= 1, "must be >= 1"),
            ("data.generated.num_groups", self.data.generated.num_groups >= 1, "must be >= 1"),
            ("data.generated.group_size", self.data.generated.group_size >= 1, "must be >= 1"),
            ("data.generated.sts_pairs", self.data.generated.sts_pairs >= 0, "must be >= 0"),
            ("model.dropout", 0 <= self.model.dropout < 1, "must be in [0, 1)"),
            ("mining.top_k", self.mining.top_k >= 1, "must be >= 1"),
            (
                "mining.range_min",
                0 <= self.mining.range_min < self.mining.top_k,
                "must be in [0, mining.top_k)",
            ),
            (
                "mining.range_max",
                self.mining.range_max is None
                or self.mining.range_min < self.mining.range_max <= self.mining.top_k,
                "must be in (mining.range_min, mining.top_k]",
            ),
            (
                "mining.relative_margin",
                self.mining.relative_margin is None or 0 <= self.mining.relative_margin < 1,
                "must be in [0, 1)",
            ),
            ("mining.num_negatives", self.mining.num_negatives >= 1, "must be >= 1"),
            ("mining.flat_max_rows", self.mining.flat_max_rows >= 1, "must be >= 1"),
            ("mining.nlist", self.mining.nlist is None or self.mining.nlist >= 1, "must be >= 1"),
            ("mining.nprobe", self.mining.nprobe >= 1, "must be >= 1"),
            ("mining.pq_m", self.mining.pq_m >= 1, "must be >= 1"),
            ("mining.encode_batch_size", self.mining.encode_batch_size >= 1, "must be >= 1"),
            ("mining.encode_actors", self.mining.encode_actors >= 0, "must be >= 0"),
            ("mining.encode_num_cpus", self.mining.encode_num_cpus > 0, "must be > 0"),
            ("mining.encode_num_gpus", self.mining.encode_num_gpus >= 0, "must be >= 0"),
            ("mining.num_cpus", self.mining.num_cpus >= 0, "must be >= 0"),
            ("mining.num_gpus", self.mining.num_gpus >= 0, "must be >= 0"),
            ("mining.timeout_s", self.mining.timeout_s > 0, "must be > 0"),
            ("mining.max_staleness_steps", self.mining.max_staleness_steps >= 0, "must be >= 0"),
            ("tracking.experiment", bool(self.tracking.experiment.strip()), "must not be empty"),
            (
                "tracking.register_as",
                self.tracking.register_as is None or bool(self.tracking.register_as.strip()),
                "must not be empty",
            ),
            ("eval.every_steps", self.eval.every_steps >= 0, "must be >= 0"),
            ("eval.batch_size", self.eval.batch_size >= 1, "must be >= 1"),
            (
                "eval.whitening_dim",
                self.eval.whitening_dim is None or self.eval.whitening_dim >= 1,
                "must be >= 1",
            ),
            ("eval.whitening_rows", self.eval.whitening_rows >= 2, "must be >= 2"),
        ]
        if self.run.name is not None:
            checks.append(
                (
                    "run.name",
                    bool(self.run.name) and all(c.isalnum() or c in "-_." for c in self.run.name),
                    "may hold only letters, digits, '-', '_' and '.'",
                )
            )
        for key, ok, message in checks:
            if not ok:
                raise ConfigError(f"{key} {message} (got {get_dotted(self.to_dict(), key)!r})")
        generated = self.data.generated.num_groups * self.data.generated.group_size
        if (
            self.data.path is None
            and self.mining.negative_mode == "neighbourhood"
            and generated < self.train.batch_size
        ):
            raise ConfigError(
                f"train.batch_size ({self.train.batch_size}) is larger than the generated corpus "
                f"(data.generated: {generated} sentences)"
            )
        if self.mining.negative_mode == "triplet" and self.data.path is None:
            raise ConfigError(
                "mining.negative_mode=triplet needs data.path: a file with anchor/positive columns"
            )
        if self.data.path is None and self.data.format != "auto":
            raise ConfigError("data.format is set but data.path is not")
        return self


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def get_dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a field annotation, converting only lossless cases (int->float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key} has the wrong type")
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if isinstance(value, str):
            value = [value]  # --set eval.sts=dev.csv: one item
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list (got {value!r})")
        return [_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, allowed))} (got {value!r})")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false (got {value!r})")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer (got {value!r})")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads 1e-4 (no dot) as a string; it is plainly meant as a number.
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number (got {value!r})")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string (got {value!r})")
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value, key)
    raise ConfigError(f"{key}: unsupported field type {annotation!r}")


def _build(cls: type, mapping: Any, prefix: str) -> Any:
    where = prefix or "config"
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where} must be a mapping (got {mapping!r})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in mapping:
        if key not in names:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(
                f"unknown config key {dotted!r} (known under {where}: {', '.join(sorted(names))})"
            )
    kwargs = {}
    for name in names:
        if name in mapping:
            dotted = f"{prefix}.{name}" if prefix else name
            kwargs[name] = _coerce(mapping[name], hints[name], dotted)
    return cls(**kwargs)


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=c`` -> (``a.b``, YAML-parsed ``c``), so ``3`` is an int and ``null`` is None."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (got {text!r})")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value (got {text!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load defaults <- YAML file <- ``--set`` overrides, then type-check and validate.

    Raises:
        ConfigError: naming the first bad key.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        tree = loaded or {}
    for item in overrides:
        key, value = parse_override(item)
        nested: dict[str, Any] = {}
        cursor = nested
        parts = key.split(".")
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _merge(tree, nested)
    return _build(Config, tree, "").validate()


def config_from_dict(tree: dict[str, Any]) -> Config:
    """Rebuild a Config from :meth:`Config.to_dict` output (e.g. inside a Ray worker)."""
    return _build(Config, tree, "")


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
