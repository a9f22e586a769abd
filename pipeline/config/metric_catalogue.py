"""Every metric key the project logs, with a sentence each: the one place a key is declared.

A reviewer opens ``train/`` and ``eval/`` first, so charts are kept to values that move during
a run. Where a key lives:

- ``chart``: an MLflow metric with one point per step, epoch or refresh.
- ``summary``: one point per run, kept as a metric (not a param) because the runs table sorts
  and filters on metrics: the shipped model's selection score and step (its other scores are
  the logged model's metrics and ``best.*`` run tags).
- ``table``: a row of the per-refresh table artifact ``mining/refreshes.json`` (one column per
  mining, one row per diagnostic of the miner), not a chart; such values matter when something is
  wrong, and a table shows all of them for every refresh on one screen.
- ``param``: logged once as a run param (it never changes within a run).
- ``system``: MLflow's System metrics tab (sampled by :mod:`pipeline.tracking.system`).
- ``offline``: the offline mining job's report (``raysimcse mine``), one point per run.

Patterns name their variable parts in braces: ``{set}`` an eval file or retrieval set,
``{filter}`` a negative filter (:data:`pipeline.mining.negatives.FILTERS`), ``{stat}`` one of
``mean``/``p10``/``p50``/``p90``, ``{stage}`` a timed stage, ``{metric}`` a retrieval score.
tests/tracking/test_metric_catalogue.py holds the source's key literals, both miner modes'
output and docs/mlflow.md to this list; tests/test_end_to_end.py holds a demo run's keys to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

Kind = Literal["chart", "summary", "table", "param", "system", "offline"]
MINING_TABLE = "mining/refreshes.json"
"""The per-refresh table artifact (``table`` keys are its rows, after ``step``)."""
MAX_MINING_CHARTS = 8
"""At most this many ``mining/`` charts in one run: the rest is in :data:`MINING_TABLE`."""


@dataclass(frozen=True)
class MetricSpec:
    pattern: str
    kind: Kind
    doc: str

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[a-z]+\})", pattern)
    return re.compile(
        "".join("[A-Za-z0-9_.\\-]+" if p.startswith("{") else re.escape(p) for p in parts) + "$"
    )


# One line per key: pattern, kind, what it says (a table, so not formatted call by call).
# fmt: off
_TRAIN = [
    MetricSpec("train/loss", "chart", "InfoNCE loss of the step's global batch (rank 0's view)."),
    MetricSpec("train/learning_rate", "chart", "The scheduler's learning rate after the step."),
    MetricSpec("train/sentences_per_s", "chart", "Rows trained per second, all workers, data wait included (pairs: a row is 2+k texts)."),
    MetricSpec("train/tokens_per_s", "chart", "Non-padding tokens per second over all workers."),
    MetricSpec("train/mfu", "chart", "Model FLOPs utilisation against the device's peak (GPU runs only)."),
    MetricSpec("train/epoch_loss", "chart", "Mean step loss of the epoch, logged at its last step."),
    MetricSpec("train/epoch_seconds", "chart", "Wall time of the epoch's steps."),
    MetricSpec("train/epoch", "chart", "Epochs finished, logged at each epoch's last step."),
    MetricSpec("train/plan_version", "chart", "Version of the batch plan the epoch trained on (0: random)."),
    MetricSpec("train/padding_share", "chart", "Share of the epoch's token slots that were padding."),
    MetricSpec("train/resumed_at_step", "chart", "The step a resumed run restarted from (only on resume)."),
]
_EVAL = [
    MetricSpec("eval/sts_{set}_spearman", "chart", "Spearman x 100 of cosine similarity against gold, per STS file."),
    MetricSpec("eval/sts_{set}_alignment", "chart", "Alignment: mean squared distance of gold-positive pairs."),
    MetricSpec("eval/sts_{set}_uniformity", "chart", "Uniformity: log mean Gaussian potential over random pairs."),
    MetricSpec("eval/sts_{set}_mrr_at_10", "chart", "Paraphrase retrieval inside the STS file: MRR@10 x 100."),
    MetricSpec("eval/sts_{set}_recall_at_1", "chart", "The same: Recall@1 x 100 (positives: gold >= 0.8 x the scale's top)."),
    MetricSpec("eval/retrieval_{set}_{metric}", "chart", "nDCG@10, MRR@10, Recall@1/@10/@100 x 100, per retrieval set."),
    MetricSpec("eval/wall_seconds", "chart", "Wall time of the evaluation (named to chart after the scores)."),
]
_BEST = [
    MetricSpec("best/score", "summary", "The exported model's eval.select_by score: sort runs by what they ship."),
]
_MINING_CHARTS = [
    MetricSpec("mining/total_s", "chart", "Seconds one refresh took: encode, index, search and planning."),
    MetricSpec("mining/selected", "chart", "Pairs task: mined negatives kept in this refresh (sampling random: the rank window's)."),
    MetricSpec("mining/negative_similarity_mean", "chart", "Pairs task: mean cosine of the mined negatives to their anchors."),
    MetricSpec("mining/batch_similarity_mean", "chart", "Corpus task: mean in-batch pair cosine of the new plan."),
    MetricSpec("mining/churn", "chart", "Share of the plan that changed since the previous refresh (pairs: of the rows' mined negatives)."),
    MetricSpec("mining/refresh_wait_s", "chart", "Seconds the trainer waited for the refresh at the boundary."),
    MetricSpec("mining/next_plan_staleness_steps", "chart", "Steps the adopted plan's weights were behind (async runs only)."),
    MetricSpec("mining/refresh_late", "chart", "1 where the boundary found the refresh not ready (async runs only)."),
    MetricSpec("mining/miner_restarts", "chart", "Times the miner actor was restarted (logged only when it happens)."),
]
_MINING_TABLE = [
    MetricSpec("mining/plan_version", "table", "The plan version this refresh produced."),
    MetricSpec("mining/{stage}_s", "table", "Seconds per stage: encode, index, (corpus: partition,) search, then filter or plan."),
    MetricSpec("mining/corpus_size", "table", "Texts encoded and indexed (the pool in the pairs task)."),
    MetricSpec("mining/index_estimated_mib", "table", "Estimated FAISS index memory."),
    MetricSpec("mining/candidates", "table", "Neighbours looked at before the filters."),
    MetricSpec("mining/kept", "table", "Candidates left after every filter."),
    MetricSpec("mining/removed_{filter}", "table", "Candidates each filter removed."),
    MetricSpec("mining/passed_{filter}", "table", "Pairs task: candidates still in the running after each filter."),
    MetricSpec("mining/random_negatives", "table", "Pairs task: random pool negatives added (mining.random_negatives)."),
    MetricSpec("mining/anchors_short", "table", "Pairs task: anchors left with fewer negatives than asked (never an error)."),
    MetricSpec("mining/positive_similarity_mean", "table", "Pairs task: mean cosine of anchors to their positives."),
    MetricSpec("mining/random_pair_similarity_mean", "table", "Pairs task: mean cosine of anchors to random pool rows."),
    MetricSpec("mining/negative_similarity_{stat}", "table", "Pairs task: the mined negatives' cosine percentiles."),
    MetricSpec("mining/teacher_positive_score", "table", "Pairs task, mining.teacher: the teacher's mean score of the rows' positives."),
    MetricSpec("mining/teacher_negative_score", "table", "Pairs task, mining.teacher: its mean score of the negatives kept."),
    MetricSpec("mining/teacher_margin_p50", "table", "Pairs task, mining.teacher: median of positive less highest-scored negative, a row."),
    MetricSpec("mining/teacher_pairs", "table", "Pairs task, mining.teacher: distinct (anchor, candidate) pairs it scored."),
    MetricSpec("mining/teacher_computed", "table", "Pairs task, mining.teacher: texts (bi-encoder) or pairs it computed, not from its cache."),
    MetricSpec("mining/teacher_denoised", "table", "Pairs task, mining.teacher.denoise_margin: negatives dropped as likely positives."),
    MetricSpec("mining/top1_similarity_mean", "table", "Corpus task: mean cosine to the nearest kept neighbour."),
    MetricSpec("mining/batch_similarity_{stat}", "table", "Corpus task: in-batch pair cosine percentiles."),
    MetricSpec("mining/random_batch_similarity_mean", "table", "Corpus task: the same for random pairs of rows (what random batches hold)."),
    MetricSpec("mining/false_negatives_flagged", "table", "Rows with a likely false negative flagged."),
    MetricSpec("mining/false_negative_pairs_in_batches", "table", "Flagged pairs that still share a batch."),
    MetricSpec("mining/partitions", "table", "Corpus task: partitions of near texts planned one at a time."),
    MetricSpec("mining/kept_outside_partition", "table", "Corpus task: kept neighbours in another partition (unused by the plan)."),
]
_PARAMS = [
    MetricSpec("data/rows", "param", "Training rows (sentences, or pairs in the pairs task)."),
    MetricSpec("data/texts", "param", "Distinct texts tokenized (the corpus the miner encodes)."),
    MetricSpec("data/truncated_share", "param", "Share of texts cut at data.max_seq_len."),
    MetricSpec("data/unk_share", "param", "Share of [UNK] tokens; above 1% the job warns (wrong tokenizer?)."),
]
_SYSTEM = [
    MetricSpec("system/{metric}", "system", "MLflow's system metrics: CPU, memory, disk, network, GPU."),
    MetricSpec("system/node_{set}/{metric}", "system", "The same for each worker node other than the driver's."),
]
_OFFLINE = [
    MetricSpec("mining/rows_in", "offline", "Offline mining: pairs read."),
    MetricSpec("mining/rows_out", "offline", "Offline mining: rows written with their negatives."),
]
# fmt: on
CATALOGUE: tuple[MetricSpec, ...] = (
    *_TRAIN,
    *_EVAL,
    *_BEST,
    *_MINING_CHARTS,
    *_MINING_TABLE,
    *_PARAMS,
    *_SYSTEM,
    *_OFFLINE,
)  # fmt: skip
CHARTED_MINING_KEYS = frozenset(spec.pattern for spec in _MINING_CHARTS)


def spec_for(key: str, kinds: tuple[Kind, ...] | None = None) -> MetricSpec | None:
    """The first catalogue entry (of ``kinds``, default any) whose pattern matches ``key``."""
    for spec in CATALOGUE:
        if (kinds is None or spec.kind in kinds) and spec.regex.match(key):
            return spec
    return None


def undeclared(keys: list[str] | set[str], kinds: tuple[Kind, ...] | None = None) -> list[str]:
    """The keys no catalogue entry (of ``kinds``) declares, sorted."""
    return sorted(key for key in keys if spec_for(key, kinds) is None)


def mining_charts(metrics: dict[str, float]) -> dict[str, float]:
    """The part of a refresh's metrics that is charted; the rest goes to :data:`MINING_TABLE`."""
    return {key: value for key, value in metrics.items() if key in CHARTED_MINING_KEYS}
