"""The peer side of each recipe: sentence-transformers' MultipleNegativesRankingLoss training on
the same model, rows, batch size, max length, learning rate and steps, scored by the same STS
evaluation as the pipeline's runs.

    python -m bench.st_mnrl_recipe --model runs/recipe-data/all-MiniLM-L6-v2 \\
        --train runs/recipe-data/wiki-sentences.txt --max-rows 3072 --epochs 2 --lr 3e-5 \\
        --sts ../shared/data/stsb/sts-dev.csv --out runs/st-wiki

A text file trains unsupervised (each sentence is its own positive, so only dropout tells the two
views apart: SimCSE as sentence-transformers does it); a jsonl with anchor/positive[/negative]
trains supervised, and so does a ``.tsv`` pair file read as it is: headerless
``sentence1\tsentence2[\tlabel]``, quoting off (the twitter-url corpus), its label-1 rows (every
row without a label column) as (anchor, positive); with ``--given-negatives`` its label-0 rows'
texts are negatives of their anchor's rows, dealt out as the pipeline's ``data.given_negatives``
deals them, and the rows of an anchor without one are left out. ``--max-rows`` picks the rows the pipeline picks (``data.max_rows``). MNRL's
scale 20 is SimCSE's temperature 0.05. ``--seed`` (default 42, as ``run.seed``) seeds the
trainer: dropout, initialisation of anything new, and the order of the rows in batches (the
rows themselves do not depend on it). ``--warmup-ratio`` (default 0) warms the learning rate up
linearly over that share of the steps; ``--no-duplicates`` batches with sentence-transformers'
``NO_DUPLICATES`` sampler (no text twice in a batch: with several positives per anchor, the
anchor's other positives are then never its in-batch negatives). Prints one JSON line: with
``--sts``, Spearman x 100 and the paraphrase retrieval scores (MRR@10, recall@1, x 100) of the
final model, per file and averaged; always ``model_dir``, the final model's folder, for an
evaluation elsewhere (``python -m bench.hard_negatives --task twitter-url`` scores it with
``jobs/evaluate.py --retrieval``).

``--mine-hard-negatives`` first runs ``sentence_transformers.util.mine_hard_negatives`` on the
(anchor, positive) pairs of those rows with the starting model, once, before training (the
peer's documented use: mine, then train on the mined tuples), and trains MNRL on anchor,
positive, the given negative (where the file has one) and the mined negatives. The defaults
are the pipeline's triplet-mode ``mining`` defaults: ``--range-min 10``, ``--range-max 64``
(``mining.top_k``: the candidates searched; 0 or a negative value: none, sentence-transformers
derives it from the others), ``--relative-margin 0.05``, ``--num-negatives 1``,
``--sampling top``; exact faiss search, the model's max length, the pipeline's encode batch
for the device (64 on a CPU, 1024 on a GPU) unless ``--mining-batch-size`` says otherwise. The candidates are the training rows' positives, or with
``--mining-corpus`` (``mine_hard_negatives(corpus=...)``) a text file's lines, or ``all-rows``:
the second column of every row of the ``--train`` pair file, whatever its label (twitter-url:
all 29,163 distinct train tweets, the label-0 ones too). An anchor's every known positive is
excluded, as sentence-transformers does for an anchor that occurs in several rows. Rows whose pair got fewer than ``--num-negatives`` negatives are
left out of training, as the peer's ``n-tuple`` output leaves them out (a batch of MNRL needs
the same columns in every row). The JSON line then also has ``mined_anchors`` (rows that got
their negatives, of ``mining_rows_in``), ``mining_seconds`` and ``mining_settings``.

``--teacher DIR`` (a sentence-transformers-readable bi-encoder folder: issue 71's peer "given
the same teacher") scores each training tuple with ``SentenceTransformer(DIR).encode(...,
normalize_embeddings=True)`` at ``--max-seq-len`` (as the pipeline's teacher reads
``data.max_seq_len``): the cosine of the anchor with its positive and with each negative, each
distinct text encoded once. It serves two options, one or both:

``--teacher-denoise-margin M`` (with ``--mine-hard-negatives``): ``mine_hard_negatives`` is
asked for :data:`DENOISE_DEPTH` times ``--num-negatives`` negatives a pair (at most what
``--range-min``/``--range-max`` leave; with a derived ``range_max`` sentence-transformers widens
its window to fit), nearest first (``labeled-list`` output: a pair keeps however many it got);
the teacher drops each mined negative it scores at or above its score of the positive less
``M``, and a pair keeps its first ``--num-negatives`` survivors in mined order (the pipeline's
``mining.teacher.denoise_margin``: the nearest survivors, refilled from deeper ranks). Pairs
left with fewer are left out of training as above. The JSON line adds ``teacher_denoised``
(mined negatives the teacher dropped, over every pair's whole mined depth, as the pipeline's
``mining/teacher_denoised`` counts its window), ``teacher_depth`` and ``teacher_seconds``.

``--distill {kl,margin_mse}`` (default ``none``) with ``--distill-weight W`` (default 1.0)
trains on MNRL plus W times a distillation term over the same rows and one forward pass
(:func:`mnrl_with_distillation`): ``kl`` is sentence-transformers' ``DistillKLDivLoss`` on
cosines at temperature 0.05 (SimCSE's, MNRL's scale 20) divided by its T² = 0.0025, which is
the pipeline's ``train.distill_loss: kl`` (:func:`pipeline.training.distillation_loss.
distillation_loss`), so W means what ``train.distill_weight`` means; ``margin_mse`` its
``MarginMSELoss`` on cosines (the pipeline's ``margin_mse``). The teacher's scores of each
row's candidates (positive, then every negative column) are the dataset's ``label`` column:
``[pos, neg_1, .., neg_n]`` for ``kl``, ``[pos - neg_j for each j]`` for ``margin_mse``, the
formats those losses document. Distillation needs a negative column (mined or given).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import POSITIVE_LABEL, argument_parser, read_json_lines, read_pair_file
from pipeline.config.train_section import DIRECTIONS_RULE, INFONCE_DIRECTIONS, valid_directions

ALL_ROWS = "all-rows"
"""``--mining-corpus``: the second column of every row of the ``--train`` pair file."""
MNRL_SCALE = 20.0
"""MNRL's scale: SimCSE's temperature 0.05."""
DISTILL_TEMPERATURE = 0.05
"""``--distill kl``'s temperature, on cosines: the pipeline's (InfoNCE's)."""
DISTILL_KINDS = ("none", "kl", "margin_mse")
DENOISE_DEPTH = 4
"""``--teacher-denoise-margin``: negatives mined a pair, as a multiple of ``--num-negatives``,
for the teacher to drop from and the survivors to refill from."""


def mining_corpus(spec: str | None, train_path: str) -> list[str] | None:
    """``--mining-corpus``: None (the training rows' positives), :data:`ALL_ROWS` (the
    distinct second column of every row of the ``train_path`` pair file, any label) or a text
    file (its distinct stripped lines), in first-seen order, empty texts left out."""
    if spec is None:
        return None
    if spec == ALL_ROWS:
        if not train_path.endswith(".tsv"):
            raise ValueError(
                f"--mining-corpus {ALL_ROWS} needs a .tsv pair file as --train, not {train_path}"
            )
        texts = [second for _, second, _ in read_pair_file(train_path)]
    else:
        texts = [line.strip() for line in Path(spec).read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys(t for t in texts if t))


def training_rows(path: str, max_rows: int | None, *, given_negatives: bool = False) -> dict[str, list[str]]:
    """The rows ``data.max_rows`` selects: for text, distinct stripped sentences ordered by the
    pipeline's content hash; for jsonl, the first rows with a non-empty anchor and positive; for
    a ``.tsv`` pair file (:func:`read_pair_file`), the first label-1 rows with both texts
    non-empty, and with ``given_negatives`` each one's given negative (:func:`given_negative_texts`;
    rows without one left out)."""
    from pipeline.data.utf8 import stable_row_id

    if path.endswith(".tsv"):
        rows = [(a, p, label) for a, p, label in read_pair_file(path) if a and p]
        columns = {
            "anchor": [a for a, _, label in rows if label == POSITIVE_LABEL],
            "positive": [p for _, p, label in rows if label == POSITIVE_LABEL],
        }
        if given_negatives:
            label_zero = [(a, text) for a, text, label in rows if label != POSITIVE_LABEL]
            columns["negative"] = given_negative_texts(columns["anchor"], columns["positive"], label_zero)
        columns = {name: values[:max_rows] if max_rows else values for name, values in columns.items()}
        if given_negatives:  # MNRL needs the same columns in every row: those without one are left out
            kept = [i for i, negative in enumerate(columns["negative"]) if negative is not None]
            columns = {name: [values[i] for i in kept] for name, values in columns.items()}
        return columns
    if path.endswith(".jsonl"):
        records = read_json_lines(path)
        records = [r for r in records if r.get("anchor", "").strip() and r.get("positive", "").strip()]
        records = records[:max_rows] if max_rows else records
        columns = {
            "anchor": [r["anchor"].strip() for r in records],
            "positive": [r["positive"].strip() for r in records],
        }
        if all(r.get("negative", "").strip() for r in records):
            columns["negative"] = [r["negative"].strip() for r in records]
        return columns
    lines = {line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()}
    ordered = sorted(lines, key=stable_row_id)
    ordered = ordered[:max_rows] if max_rows else ordered
    return {"anchor": ordered, "positive": list(ordered)}


def given_negative_texts(
    anchors: list[str], positives: list[str], label_zero: list[tuple[str, str]]
) -> list[str | None]:
    """Each (anchor, positive) row's given negative, one of its anchor's label-0 texts
    (``label_zero``: (anchor, text) rows), dealt out as the pipeline's ``data.given_negatives``
    deals them (:func:`~pipeline.data.pair_labels.round_robin_negatives` on the same text ids),
    so both sides train on the same triplets; None where the anchor has none."""
    import numpy as np

    from pipeline.data.pair_labels import round_robin_negatives
    from pipeline.data.utf8 import stable_row_id

    def ids(texts: list[str]) -> np.ndarray:
        return np.array([stable_row_id(t) for t in texts], dtype=np.int64)

    zero_texts = [t for _, t in label_zero]
    zero_ids = ids(zero_texts)
    negative_ids = round_robin_negatives(
        ids(anchors), ids(positives), ids([a for a, _ in label_zero]), zero_ids
    )
    text_of = dict(zip(zero_ids.tolist(), zero_texts, strict=True))
    return [text_of[n] if n >= 0 else None for n in negative_ids.tolist()]


class PeerMining(NamedTuple):
    """``mine_hard_negatives``' settings; the defaults are the pipeline's ``mining`` defaults."""

    range_min: int = 10
    range_max: int | None = 64
    """The candidates searched per anchor (the pipeline's ``mining.top_k``; None:
    sentence-transformers derives it from the other settings)."""
    relative_margin: float | None = 0.05
    num_negatives: int = 1
    sampling: str = "top"
    batch_size: int | None = None
    """Sentences per encode batch; None: the pipeline's on the peer's device
    (:func:`pipeline.model.encode.encode_batch_size`)."""


class TeacherScorer:
    """``--teacher``: a sentence-transformers bi-encoder's cosine of (anchor, candidate) pairs,
    on :func:`peer_device`, each distinct text encoded once however many pairs (and calls) it
    is in; ``seconds`` the time spent loading and encoding."""

    def __init__(self, folder: str | Path, *, max_seq_len: int, batch_size: int | None = None):
        from sentence_transformers import SentenceTransformer

        from pipeline.model.encode import encode_batch_size

        started = time.perf_counter()
        self.model = SentenceTransformer(str(folder), device=peer_device())
        self.model.max_seq_length = max_seq_len
        self.batch_size = batch_size or encode_batch_size(self.model.device)
        self._row: dict[str, int] = {}
        self._vectors: list[Any] = []
        self.seconds = time.perf_counter() - started

    def scores(self, anchors: list[str], candidates: list[list[str]]) -> list[list[float]]:
        """Per row, the cosine of ``anchors[i]`` with each of ``candidates[i]``, in order."""
        import numpy as np

        started = time.perf_counter()
        texts = dict.fromkeys([*anchors, *(c for row in candidates for c in row)])
        new = [t for t in texts if t not in self._row]
        if new:
            vectors = self.model.encode(
                new, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )  # fmt: skip
            first = len(self._row)
            self._row.update((t, first + i) for i, t in enumerate(new))
            self._vectors.append(np.asarray(vectors, dtype=np.float32))
            self._vectors = [np.concatenate(self._vectors)]
        table = self._vectors[0] if self._vectors else np.zeros((0, 0), dtype=np.float32)
        left = np.array(
            [self._row[a] for a, row in zip(anchors, candidates, strict=True) for _ in row], dtype=np.int64
        )
        right = np.array([self._row[c] for row in candidates for c in row], dtype=np.int64)
        flat = np.einsum("ij,ij->i", table[left], table[right]).tolist() if len(left) else []
        out, at = [], 0
        for row in candidates:
            out.append(flat[at : at + len(row)])
            at += len(row)
        self.seconds += time.perf_counter() - started
        return out

    def close(self) -> None:
        """Free the teacher (its GPU memory before training)."""
        import gc

        import torch

        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def teacher_denoised(
    negatives: list[str], scores: list[float], *, positive_score: float, margin: float, keep: int
) -> tuple[list[str], int]:
    """One pair's mined ``negatives`` (nearest first) after the teacher's denoising: each one
    it scores (``scores[j]``) at or above ``positive_score - margin`` is dropped, and the first
    ``keep`` survivors are kept in their order (the rule of
    :func:`pipeline.mining.teacher_scores.denoised`); returns them and how many were dropped."""
    threshold = positive_score - margin
    survivors = [n for n, score in zip(negatives, scores, strict=True) if not score >= threshold]
    return survivors[:keep], len(negatives) - len(survivors)


def denoise_depth(settings: PeerMining) -> int:
    """Negatives mined a pair for ``--teacher-denoise-margin``: :data:`DENOISE_DEPTH` times
    ``num_negatives``, at most what ``range_min``/``range_max`` leave (a derived ``range_max``
    leaves any)."""
    depth = settings.num_negatives * DENOISE_DEPTH
    if settings.range_max is not None:
        depth = min(depth, settings.range_max - settings.range_min)
    return max(depth, settings.num_negatives)


class TeacherDenoise(NamedTuple):
    """``--teacher-denoise-margin``: the teacher and its margin."""

    scorer: TeacherScorer
    margin: float


def mine_negatives(
    model_dir: str | Path,
    rows: dict[str, list[str]],
    settings: PeerMining,
    *,
    max_seq_len: int,
    seed: int,
    corpus: list[str] | None = None,
    denoise: TeacherDenoise | None = None,
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``mine_hard_negatives`` on the (anchor, positive) pairs of ``rows`` with the model in
    ``model_dir`` as it starts, among ``corpus`` (None: the rows' positives; sentence-
    transformers adds the positives to a given corpus); returns the rows that got
    ``num_negatives`` negatives, in their order, with columns ``mined_negative_1`` .. ``_n``
    after the given ones, and a report (``mined_anchors``, ``mining_rows_in``,
    ``mining_seconds``, ``mining_settings``, and ``mining_corpus``: the texts of a given
    corpus). With ``denoise``, :func:`denoise_depth` negatives are mined a pair, the teacher
    drops those :func:`teacher_denoised` says, and the first ``num_negatives`` survivors are
    kept (the report adds ``teacher_denoised`` and ``teacher_depth``)."""
    import contextlib
    import random

    import datasets
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from pipeline.model.encode import encode_batch_size

    model = SentenceTransformer(str(model_dir), device=peer_device())
    model.max_seq_length = max_seq_len
    batch_size = settings.batch_size or encode_batch_size(model.device)
    random.seed(seed)  # sampling="random" draws with Python's random
    pairs = datasets.Dataset.from_dict({"anchor": rows["anchor"], "positive": rows["positive"]})
    depth = settings.num_negatives if denoise is None else denoise_depth(settings)
    started = time.perf_counter()
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):  # its progress bars
        mined = mine_hard_negatives(
            pairs, model, corpus=corpus, range_min=settings.range_min, range_max=settings.range_max,
            relative_margin=settings.relative_margin, num_negatives=depth,
            sampling_strategy=settings.sampling,
            # labeled-list: a pair keeps the negatives it got, however few (n-tuple drops it)
            output_format="n-tuple" if denoise is None else "labeled-list",
            batch_size=batch_size, use_faiss=True, verbose=False,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    del model
    # The output is one row per distinct (anchor, positive), reordered: join it back to the rows.
    found = mined.to_dict()
    teacher_report: dict[str, Any] = {}
    if denoise is None:
        negative_columns = [f"negative_{i}" for i in range(1, settings.num_negatives + 1)]
        by_pair = {
            (a, p): [found[c][i] for c in negative_columns]
            for i, (a, p) in enumerate(zip(found["anchor"], found["positive"], strict=True))
        }
    else:
        # labeled-list: the "positive" column is [positive, negative_1, ...], nearest first.
        listed = {
            (a, texts[0]): texts[1:] for a, texts in zip(found["anchor"], found["positive"], strict=True)
        }
        scored = denoise.scorer.scores([a for a, _ in listed], [[p, *n] for (_, p), n in listed.items()])
        by_pair, dropped = {}, 0
        for (pair, negatives), (positive_score, *scores) in zip(listed.items(), scored, strict=True):
            kept, lost = teacher_denoised(
                negatives, scores, positive_score=positive_score, margin=denoise.margin,
                keep=settings.num_negatives,
            )  # fmt: skip
            dropped += lost
            if len(kept) == settings.num_negatives:
                by_pair[pair] = kept
        teacher_report = {"teacher_denoised": dropped, "teacher_depth": depth}
    keep = [i for i, pair in enumerate(zip(rows["anchor"], rows["positive"], strict=True)) if pair in by_pair]
    out = {name: [values[i] for i in keep] for name, values in rows.items()}
    for n in range(settings.num_negatives):
        out[f"mined_negative_{n + 1}"] = [by_pair[(rows["anchor"][i], rows["positive"][i])][n] for i in keep]
    report = {
        "mined_anchors": len(keep),
        "mining_rows_in": len(rows["anchor"]),
        "mining_seconds": round(seconds, 1),
        "mining_settings": settings._asdict(),
        **({"mining_corpus": len(corpus)} if corpus is not None else {}),
        **teacher_report,
    }
    return out, report


def distillation_labels(scorer: TeacherScorer, rows: dict[str, list[str]], kind: str) -> list[list[float]]:
    """The ``label`` column of ``--distill kind``: the teacher's scores of each row's anchor
    (its first column) with each candidate (every later column: positive, then negatives),
    ``[pos, neg_1, .., neg_n]`` for ``kl`` (``DistillKLDivLoss``' format), ``[pos - neg_j for
    each j]`` for ``margin_mse`` (``MarginMSELoss``')."""
    anchor, *candidates = rows
    scores = scorer.scores(
        rows[anchor], [list(row) for row in zip(*(rows[c] for c in candidates), strict=True)]
    )
    if kind == "kl":
        return scores
    return [[pos - neg for neg in negs] for pos, *negs in scores]


def mnrl(model: Any, hardness_strength: float = 0.0, directions: tuple[str, ...] = INFONCE_DIRECTIONS) -> Any:
    """``MultipleNegativesRankingLoss(scale=20)`` (SimCSE's temperature 0.05), with
    ``--hardness-strength`` its hardness weighting of each row's own negatives
    (``hardness_mode="hard_negatives"``, the pipeline's ``train.hardness_strength``) and
    ``--directions`` its terms in one joint softmax (the pipeline's ``train.directions``)."""
    hardness = {"hardness_mode": "hard_negatives", "hardness_strength": hardness_strength}
    terms = {"directions": directions, "partition_mode": "joint"}
    # Each option is passed only when set, so the plain peer builds on releases without them.
    return st_losses().MultipleNegativesRankingLoss(
        model, scale=MNRL_SCALE, **(hardness if hardness_strength else {}),
        **(terms if directions != INFONCE_DIRECTIONS else {}),
    )  # fmt: skip


def st_losses() -> Any:
    """sentence-transformers' losses module, where this release keeps it."""
    try:
        from sentence_transformers.sentence_transformer import losses
    except ImportError:  # older releases: the package's losses module
        from sentence_transformers import losses
    return losses


def mnrl_with_distillation(model: Any, kind: str, weight: float, mnrl_loss: Any) -> Any:
    """The loss of ``--distill kind --distill-weight weight``: an ``MnrlWithDistillation``
    (:func:`mnrl_with_distillation_class`) of ``model`` beside ``mnrl_loss`` (:func:`mnrl`)."""
    return mnrl_with_distillation_class()(model, kind, weight, mnrl_loss)


@functools.cache
def mnrl_with_distillation_class() -> type:
    """``MnrlWithDistillation``, a ``torch.nn.Module`` defined on first use (this module
    imports torch and sentence-transformers only where it needs them)."""
    import torch
    from sentence_transformers.util import pairwise_cos_sim

    losses = st_losses()
    try:
        from sentence_transformers.base.losses.merged_forward import embed_columns
    except ImportError:  # older releases: one forward a column, as their losses did

        def embed_columns(model: Any, features: Any) -> list[Any]:
            return [model(f)["sentence_embedding"] for f in features]

    def term(loss: Any, embeddings: list[Any], features: Any, labels: Any) -> Any:
        """``loss`` from the embeddings where it can (else from its own forward)."""
        if hasattr(loss, "compute_loss_from_embeddings"):
            return loss.compute_loss_from_embeddings(embeddings, labels)
        return loss(features, labels)

    class MnrlWithDistillation(torch.nn.Module):
        """MNRL (scale :data:`MNRL_SCALE`) plus ``weight`` times a distillation loss on the same
        rows, both from one forward pass of every column (sentence-transformers' trainer takes
        one loss a dataset): ``kl``, ``DistillKLDivLoss`` on cosines at
        :data:`DISTILL_TEMPERATURE` divided by its T² (sentence-transformers multiplies by T²,
        Hinton's scale for T >= 1; at 0.05 it would shrink the term 400-fold, and without it a
        weight means what the pipeline's ``train.distill_weight`` means); ``margin_mse``,
        ``MarginMSELoss`` on cosines. The labels are the teacher's scores
        (:func:`distillation_labels`); MNRL ignores them."""

        def __init__(self, model: Any, kind: str, weight: float, mnrl_loss: Any):
            super().__init__()
            if kind not in DISTILL_KINDS[1:]:
                raise ValueError(f"distillation must be one of {', '.join(DISTILL_KINDS[1:])} (got {kind!r})")
            self.model = model
            self.kind, self.weight = kind, weight
            self.mnrl = mnrl_loss
            if kind == "kl":
                self.distill = losses.DistillKLDivLoss(
                    model, similarity_fct=pairwise_cos_sim, temperature=DISTILL_TEMPERATURE
                )
                self.factor = 1.0 / DISTILL_TEMPERATURE**2
            else:
                self.distill = losses.MarginMSELoss(model, similarity_fct=pairwise_cos_sim)
                self.factor = 1.0

        def forward(self, sentence_features: Any, labels: Any) -> Any:
            features = list(sentence_features)
            embeddings = embed_columns(self.model, features)
            mnrl = term(self.mnrl, embeddings, features, labels)
            distill = term(self.distill, embeddings, features, labels) * self.factor
            return mnrl + self.weight * distill

        def get_config_dict(self) -> dict[str, Any]:
            return {"scale": MNRL_SCALE, "distill": self.kind, "distill_weight": self.weight,
                    **({"temperature": DISTILL_TEMPERATURE} if self.kind == "kl" else {})}  # fmt: skip

    return MnrlWithDistillation


def build_mnrl_trainer(
    model_dir: str | Path,
    rows: dict[str, list[str]],
    out_dir: Path,
    *,
    max_seq_len: int,
    batch_size: int,
    lr: float,
    epochs: int = 1,
    seed: int = 42,
    warmup_ratio: float = 0.0,
    no_duplicates: bool = False,
    callbacks: list[Any] | None = None,
    bf16: bool | None = None,
    distill: str = "none",
    distill_weight: float = 1.0,
    hardness_strength: float = 0.0,
    directions: tuple[str, ...] = INFONCE_DIRECTIONS,
) -> Any:
    """The peer every comparison here runs: ``SentenceTransformerTrainer`` with
    ``MultipleNegativesRankingLoss(scale=20)`` (SimCSE's temperature 0.05) on ``rows``
    (``anchor``, ``positive``[, ``negative``]), linear warm-up over ``warmup_ratio`` of the
    steps then linear decay, batches from sentence-transformers' ``NO_DUPLICATES`` sampler
    where ``no_duplicates`` (else its default sampler), no checkpoints, on :func:`peer_device`
    (on a GPU in bf16, as our workers' autocast; ``bf16`` asks for it on a CPU too). With
    ``distill`` (``kl`` or ``margin_mse``) the loss is :func:`mnrl_with_distillation` at
    ``distill_weight``, and ``rows`` carry its ``label`` column (:func:`distillation_labels`).
    ``hardness_strength`` and ``directions``: MNRL's hardness weighting of each row's own
    negatives and its terms (:func:`mnrl`)."""
    import datasets
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )

    device = peer_device()
    model = SentenceTransformer(str(model_dir), device=device)
    model.max_seq_length = max_seq_len
    contrastive = mnrl(model, hardness_strength, directions)
    train_args = SentenceTransformerTrainingArguments(
        output_dir=str(out_dir),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        warmup_ratio=warmup_ratio,
        lr_scheduler_type="linear",
        batch_sampler="no_duplicates" if no_duplicates else "batch_sampler",  # BatchSamplers' values
        seed=seed,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        disable_tqdm=True,
        dataloader_drop_last=False,
        use_cpu=device == "cpu",
        bf16=device == "cuda" if bf16 is None else bf16,
    )
    return SentenceTransformerTrainer(
        model=model,
        args=train_args,
        train_dataset=datasets.Dataset.from_dict(rows),
        loss=contrastive
        if distill == "none"
        else mnrl_with_distillation(model, distill, distill_weight, contrastive),
        callbacks=callbacks,
    )


def peer_device() -> str:
    """Where the peer runs: the GPU when there is one (as our job with ``train.gpus_per_worker``),
    else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__spec__.name, __doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument(
        "--sts", action="append", default=[], help="STS file to score the final model on (repeatable)"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--seed", type=int, default=42, help="trainer seed: dropout and batch order (default: 42)"
    )
    parser.add_argument(
        "--warmup-ratio", type=float, default=0.0, help="share of the steps warming up (default: 0)"
    )
    parser.add_argument(
        "--no-duplicates", action="store_true", help="sentence-transformers' NO_DUPLICATES batch sampler"
    )
    parser.add_argument(
        "--given-negatives",
        action="store_true",
        help="a .tsv pair file's label-0 texts as negatives of their anchor's rows, dealt as the "
        "pipeline's data.given_negatives deals them; rows without one are left out",
    )
    defaults = PeerMining()
    mining = parser.add_argument_group(
        "hard-negative mining",
        "before training, with the starting model (defaults: the pipeline's mining defaults)",
    )
    mining.add_argument(
        "--mine-hard-negatives",
        action="store_true",
        help="run sentence-transformers' mine_hard_negatives first",
    )
    for flag, kind, default, meaning in (
        ("--range-min", int, defaults.range_min, ""),
        ("--range-max", int, defaults.range_max, "candidates searched; 0 or a negative value: derived by sentence-transformers "),
        ("--relative-margin", float, defaults.relative_margin, "a negative value: none "),
        ("--num-negatives", int, defaults.num_negatives, ""),
        ("--mining-batch-size", int, defaults.batch_size, "sentences per encode batch; None: the pipeline's for the device "),
    ):  # fmt: skip
        mining.add_argument(flag, type=kind, default=default, help=f"{meaning}(default: %(default)s)")
    mining.add_argument(
        "--sampling", choices=("top", "random"), default=defaults.sampling, help="(default: %(default)s)"
    )
    mining.add_argument(
        "--mining-corpus",
        default=None,
        metavar=f"FILE|{ALL_ROWS}",
        help="candidate negatives: a text file's lines, or every row's second column of the --train "
        "pair file (default: the training rows' positives)",
    )
    teacher = parser.add_argument_group(
        "teacher", "issue 71's peer given the same teacher: its denoising and its distillation"
    )
    teacher.add_argument(
        "--teacher", default=None, metavar="DIR", help="a sentence-transformers bi-encoder folder"
    )
    teacher.add_argument(
        "--teacher-denoise-margin",
        type=float,
        default=None,
        metavar="M",
        help="with --mine-hard-negatives: mine deeper, drop the negatives the teacher scores at or "
        "above its positive's score less M, keep the nearest survivors (default: no denoising)",
    )
    teacher.add_argument(
        "--distill",
        choices=DISTILL_KINDS,
        default="none",
        help="add the teacher's scores distilled: kl (DistillKLDivLoss / T² at T 0.05), "
        "margin_mse (MarginMSELoss) (default: %(default)s)",
    )
    teacher.add_argument(
        "--distill-weight",
        type=float,
        default=1.0,
        help="weight of --distill beside MNRL (default: %(default)s)",
    )
    parser.add_argument(
        "--hardness-strength",
        type=float,
        default=0.0,
        help="MNRL's hardness weighting of each row's own negatives (hardness_mode=hard_negatives), "
        "as the pipeline's train.hardness_strength; 0: off (default: %(default)s)",
    )
    parser.add_argument(
        "--directions",
        type=lambda value: tuple(value.split(",")),
        default=INFONCE_DIRECTIONS,
        help="MNRL's terms in one joint softmax, comma-separated (query_to_doc, query_to_query, "
        "doc_to_query, doc_to_doc), as the pipeline's train.directions (default: query_to_doc)",
    )
    args = parser.parse_args(argv)
    if args.hardness_strength < 0:
        parser.error("--hardness-strength must be >= 0")
    if not valid_directions(args.directions):
        parser.error(f"--directions {DIRECTIONS_RULE}")
    uses_teacher = args.teacher_denoise_margin is not None or args.distill != "none"
    if uses_teacher and args.teacher is None:
        parser.error("--teacher-denoise-margin and --distill need --teacher")
    if args.teacher is not None and not uses_teacher:
        parser.error("--teacher serves --teacher-denoise-margin and --distill: give one")
    if args.teacher_denoise_margin is not None and not args.mine_hard_negatives:
        parser.error("--teacher-denoise-margin denoises mined negatives: it needs --mine-hard-negatives")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from pipeline.evaluation.scoring import evaluate_model_dir, score_summary

    if args.given_negatives and not args.train.endswith(".tsv"):
        parser.error("--given-negatives reads a .tsv pair file's label-0 rows")
    rows = training_rows(args.train, args.max_rows, given_negatives=args.given_negatives)
    if args.distill != "none" and len(rows) < 3 and not args.mine_hard_negatives:
        parser.error("--distill needs negatives: --mine-hard-negatives, or a jsonl with a negative")
    scorer = None
    if args.teacher is not None:
        scorer = TeacherScorer(args.teacher, max_seq_len=args.max_seq_len, batch_size=args.mining_batch_size)
    mining_report: dict[str, Any] = {}
    if args.mine_hard_negatives:
        settings = PeerMining(
            range_min=args.range_min, range_max=args.range_max if args.range_max > 0 else None,
            relative_margin=args.relative_margin if args.relative_margin >= 0 else None,
            num_negatives=args.num_negatives, sampling=args.sampling, batch_size=args.mining_batch_size,
        )  # fmt: skip
        denoise = None
        if args.teacher_denoise_margin is not None:
            assert scorer is not None
            denoise = TeacherDenoise(scorer, args.teacher_denoise_margin)
        rows, mining_report = mine_negatives(
            args.model, rows, settings, max_seq_len=args.max_seq_len, seed=args.seed,
            corpus=mining_corpus(args.mining_corpus, args.train), denoise=denoise,
        )  # fmt: skip
        if not rows["anchor"]:
            print("error: mine_hard_negatives found negatives for no row", file=sys.stderr)
            return 1
    teacher_report: dict[str, Any] = {}
    if scorer is not None:
        if args.distill != "none":
            rows = {**rows, "label": distillation_labels(scorer, rows, args.distill)}
        scorer.close()
        teacher_report = {
            "teacher": args.teacher, "teacher_denoise_margin": args.teacher_denoise_margin,
            "distill": args.distill, "distill_weight": args.distill_weight if args.distill != "none" else None,
            "teacher_seconds": round(scorer.seconds, 1),
        }  # fmt: skip
    trainer = build_mnrl_trainer(
        args.model, rows, Path(args.out) / "trainer", max_seq_len=args.max_seq_len,
        batch_size=args.batch_size, lr=args.lr, epochs=args.epochs, seed=args.seed,
        warmup_ratio=args.warmup_ratio, no_duplicates=args.no_duplicates,
        distill=args.distill, distill_weight=args.distill_weight, hardness_strength=args.hardness_strength,
        directions=args.directions,
    )  # fmt: skip
    model = trainer.model
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    out = Path(args.out) / "model"
    model.save(str(out))
    scored: dict[str, Any] = {}
    if args.sts:
        summary = score_summary(evaluate_model_dir(out, args.sts, max_seq_len=args.max_seq_len))
        scored = {k: v for k, v in summary.items() if k != "files"}  # NaN already null here
        scored["files"] = [
            {k: f[k] for k in ("name", "spearman", "mrr_at_10", "recall_at_1")} for f in summary["files"]
        ]
    peer = "sentence-transformers MNRL" + (" on mine_hard_negatives" if mining_report else "")
    if args.given_negatives:
        peer += ", the file's label-0 negatives"
    if args.teacher_denoise_margin is not None:
        peer += ", denoised by the teacher"
    if args.hardness_strength:
        peer += f", hardness-weighted negatives ({args.hardness_strength:g})"
    if args.directions != INFONCE_DIRECTIONS:
        peer += f", directions {'+'.join(args.directions)}"
    if args.distill != "none":
        peer += f", + {args.distill_weight:g} x " + (
            "DistillKLDivLoss / T^2" if args.distill == "kl" else "MarginMSELoss"
        )
    result = {
        "peer": peer,
        "seed": args.seed,
        "rows": len(rows["anchor"]),
        **mining_report,
        **teacher_report,
        **({"hardness_strength": args.hardness_strength} if args.hardness_strength else {}),
        **({"directions": list(args.directions)} if args.directions != INFONCE_DIRECTIONS else {}),
        "steps": trainer.state.global_step,
        "train_seconds": round(train_seconds, 1),
        "sentences_per_s": round(len(rows["anchor"]) * args.epochs / train_seconds, 1),
        "model_dir": str(out),
        **scored,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
