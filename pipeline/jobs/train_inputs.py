"""The training job's inputs, as the driver prepares them inside the Ray session: the
training data (with its ``[data]`` lines, tags and the batch-size check), the model folder
and the tokenized corpus, and their object-store references.

Every function here takes the resolved config (:func:`pipeline.jobs.train_job.resolve_config`) and
only reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from pipeline.config.schema import Config
from pipeline.core.errors import ConfigError
from pipeline.data.columns import input_schema
from pipeline.data.corpus import load_clean_corpus
from pipeline.data.pairs import index_pairs, load_pairs
from pipeline.data.placement import ANYWHERE, ReadNodes
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.tokenize import tokenize_texts
from pipeline.data.tokenized import TokenizedBlocks, dataset_digest
from pipeline.data.triplets import Triplets
from pipeline.evaluation.retrieval_scoring import RetrievalEvalSet
from pipeline.evaluation.retrieval_sets import RetrievalSet
from pipeline.evaluation.scoring import STSEvalSet
from pipeline.evaluation.sts import STSPairs
from pipeline.model.encoder import folder_pooler, pooler_warning
from pipeline.model.folders import fetch_pretrained_dir, load_tokenizer, pack_dir
from pipeline.model.tiny import build_random_bert_dir
from pipeline.tracking.context import InputDataset, log_run_context
from pipeline.tracking.run import TrackedRun

Echo = Callable[[str], None]


@dataclass(frozen=True)
class TrainingData:
    """What the run trains on, before tokenizing."""

    texts: DistinctTexts
    """The distinct texts, in the object store (position ``i``: the ``i``-th smallest id)."""
    triplets: Triplets | None
    """Pairs task: the (anchor, positive[, negative]) rows over ``texts``; else None."""
    rows: int
    """Training rows: sentences, or (anchor, positive) rows in the pairs task."""
    description: str
    """One line for the job summary."""


@dataclass(frozen=True)
class TokenizedInputs:
    model_dir: Path
    """The initial model folder (:func:`prepare_model_dir`)."""
    tokenizer: Any
    corpus: TokenizedBlocks
    """The tokenized corpus, in the object store."""
    unk_share: float | None = None
    """``[UNK]`` tokens among the corpus' non-special tokens; None: the tokenizer has none."""


def describe_corpus(data: TrainingData, inputs: TokenizedInputs) -> str:
    """The job summary's corpus line: the training data and its ``[UNK]`` share."""
    if inputs.unk_share is None:
        return data.description
    return f"{data.description}; {inputs.unk_share:.2%} of tokens [UNK]"


@dataclass(frozen=True)
class InputRefs:
    """Object-store references of the inputs every worker and the miner read."""

    corpus: TokenizedBlocks
    """The tokenized corpus' blocks (already in the object store)."""
    model: Any
    """The packed initial model folder (:func:`pipeline.model.folders.pack_dir`)."""
    triplets: Any = None
    eval: Any = None
    """The :class:`~pipeline.evaluation.scoring.STSEvalSet`; None without STS evaluation."""
    retrieval: Any = None
    """The :class:`~pipeline.evaluation.retrieval_scoring.RetrievalEvalSet`; None without
    retrieval evaluation."""
    texts: DistinctTexts | None = None
    """The distinct texts' blocks, kept for the miner's teacher (``mining.teacher.model``), which
    reads texts with its own tokenizer; None without a teacher (training reads tokens only)."""
    teacher: Any = None
    """The packed teacher folder, where ``mining.teacher.model`` is a local folder (the miner
    may sit on a node that shares no disk with this one); None: no teacher, or a hub name the
    miner fetches itself."""


def load_training_data(
    cfg: Config, tracked: TrackedRun, echo: Echo, *, reads: ReadNodes = ANYWHERE
) -> TrainingData:
    """Read the corpus (or the triplets), say what was read, tag the run with it and log its
    context (dataset, commit, versions). ``reads``: the inputs read on one node only.

    Raises:
        DataError: the data cannot be read.
        ConfigError: ``train.batch_size`` is larger than the data.
    """
    data = (
        _read_triplets(cfg, tracked, echo, reads) if cfg.pairs else _read_sentences(cfg, tracked, echo, reads)
    )
    dataset = InputDataset(
        source=cfg.data.path,
        digest=dataset_digest(data.texts.ids, data.triplets),
        rows=data.rows,
        kind=cfg.task,
        columns=input_schema(cfg.data, cfg.pairs),
    )
    no_commit = log_run_context(tracked, dataset)
    if no_commit:
        echo(f"[run] {no_commit}")
    if data.rows < cfg.train.batch_size:
        raise ConfigError(
            f"train.batch_size ({cfg.train.batch_size}) is larger than the corpus ({data.rows} "
            f"{'rows' if data.triplets is not None else 'sentences'})"
        )
    return data


def _read_triplets(cfg: Config, tracked: TrackedRun, echo: Echo, reads: ReadNodes) -> TrainingData:
    pairs = load_pairs(cfg.data, reads=reads)
    texts, triplets = index_pairs(pairs, cfg.data.tokenize_num_cpus)
    rows = pairs.rows_read
    pool = (
        f", mining pool {len(triplets.candidate_pool())} texts ({len(pairs.pool)} distinct in {cfg.data.pool} "
        "and the positives)"
        if pairs.pool is not None and triplets.pool is not None
        else ""
    )
    echo(f"[data] {cfg.data.path}: {pairs.describe()}, {len(texts)} distinct texts{pool}")
    tags = {
        "data.rows_read": rows,
        "data.given_negative_rows": pairs.given,
    }
    if triplets.pool is not None:
        tags["data.pool_texts"] = len(triplets.candidate_pool())
    tracked.set_tags(tags)
    description = f"{len(triplets)} triplet rows over {len(texts)} distinct texts"
    return TrainingData(texts, triplets, len(triplets), description)


def _read_sentences(cfg: Config, tracked: TrackedRun, echo: Echo, reads: ReadNodes) -> TrainingData:
    assert cfg.data.path is not None  # resolve_config named the generated corpus
    texts, stats = load_clean_corpus(cfg.data, reads=reads)
    echo(f"[data] {cfg.data.path}: {stats.describe()}")
    tracked.set_tags(stats.tags())
    description = f"{stats.sentences} sentences ({stats.empty_dropped} empty, {stats.duplicates_dropped} duplicates dropped)"
    return TrainingData(texts, None, stats.sentences, description)


def prepare_model_dir(cfg: Config, texts: Callable[[], list[str]], run_dir: Path) -> Path:
    """The initial model folder: the configured one, or a tiny BERT (:data:`~pipeline.model.tiny.TINY_BERT`)
    with a tokenizer trained on the corpus's ``texts()`` (asked for only then: a pretrained model
    never needs the corpus as Python strings on the driver). Reused as-is when a resumed run
    already made it."""
    if cfg.model.name_or_path:
        return fetch_pretrained_dir(cfg.model.name_or_path, run_dir / "initial_model")
    target = run_dir / "initial_model"
    if (target / "config.json").exists():
        return target
    return build_random_bert_dir(
        texts(), target, max_seq_len=cfg.data.max_seq_len, dropout=cfg.model.dropout, seed=cfg.run.seed
    )


def tokenize_inputs(
    cfg: Config, data: TrainingData, run_dir: Path, tracked: TrackedRun, echo: Echo
) -> TokenizedInputs:
    """Prepare the initial model folder and tokenize the corpus with its tokenizer; tag the
    run with the token statistics and log the ``data/`` params (``data/unk_share`` where the
    tokenizer has an unknown token; params, not charts: they never change within a run) and,
    where ``model.pooler`` is unset, the pooling the folder declares, where
    ``train.group_by_length`` is unset, whether these rows' random batches are grouped, with
    a warning line when many tokens are ``[UNK]``."""
    model_dir = prepare_model_dir(cfg, lambda: data.texts.gather().column("text").to_pylist(), run_dir)
    if pooler_line := pooler_warning(model_dir, cfg.model.pooler):
        echo(pooler_line)
    tokenizer = load_tokenizer(model_dir)
    t0 = time.perf_counter()
    tokenized, token_stats = tokenize_texts(data.texts, tokenizer, cfg.data)
    unk_share = token_stats.unk_share
    unk = f"; [UNK] {unk_share:.2%} of tokens" if unk_share is not None else ""
    echo(f"[data] tokenized {token_stats.describe()} in {time.perf_counter() - t0:.1f}s{unk}")
    warning = token_stats.unk_warning()
    if warning:
        echo(f"[data] {warning}")
    tracked.set_tags(token_stats.tags())
    params = {
        "data/rows": data.rows,
        "data/texts": len(data.texts),
        "data/truncated_share": f"{token_stats.truncated / max(1, token_stats.sentences):.4g}",
    }
    if unk_share is not None:
        params["data/unk_share"] = f"{unk_share:.4g}"
    if cfg.model.pooler is None:  # unset: the folder's own pooling, known only now
        params["model.pooler"] = folder_pooler(model_dir)
    if cfg.train.group_by_length is None:  # unset: resolved by the task and the rows' negatives
        given = data.triplets is not None and data.triplets.has_given_negatives
        params["train.group_by_length"] = cfg.groups_by_length(given_negatives=given)
    tracked.log_params(params)
    return TokenizedInputs(model_dir, tokenizer, tokenized, unk_share)


def put_inputs(
    cfg: Config,
    data: TrainingData,
    inputs: TokenizedInputs,
    *,
    sts_files: list[STSPairs],
    echo: Echo,
    retrieval_sets: list[RetrievalSet] | None = None,
) -> InputRefs:
    """Put the packed model folder, the triplets and the STS and retrieval evaluation sets in
    the object store once, so that each node fetches them once (the tokenized corpus is there
    already)."""
    model_ref = ray.put(pack_dir(inputs.model_dir))
    triplets_ref = ray.put(data.triplets) if data.triplets is not None else None
    when = "evaluated at the start and every epoch end" + (
        f" and every {cfg.eval.every_steps} steps" if cfg.eval.every_steps else ""
    )
    eval_ref = retrieval_ref = None
    if sts_files:
        eval_set = STSEvalSet(sts_files, inputs.tokenizer, cfg.data.max_seq_len)
        eval_ref = ray.put(eval_set)
        named = ", ".join(f"{f.name} ({len(f)} pairs)" for f in sts_files)
        echo(f"[eval] {named}: {eval_set.num_sentences} sentences, {when}")
    if retrieval_sets:
        retrieval_set = RetrievalEvalSet(retrieval_sets, inputs.tokenizer, cfg.data.max_seq_len)
        retrieval_ref = ray.put(retrieval_set)
        echo(f"[eval] retrieval {retrieval_set.describe()}: {retrieval_set.num_sentences} texts, {when}")
    texts = teacher_ref = None
    if cfg.mining.teacher.model is not None and cfg.mines:
        texts = data.texts
        if (teacher := Path(cfg.mining.teacher.model).expanduser()).is_dir():
            teacher_ref = ray.put(pack_dir(teacher))
    return InputRefs(inputs.corpus, model_ref, triplets_ref, eval_ref, retrieval_ref, texts, teacher_ref)
