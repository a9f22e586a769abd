"""Is a cross-encoder a teacher worth having? Train one on the pairs task's labelled rows and
score it as issue 71 asks: reranking a first-stage retriever's top 50 on a retrieval set.

    python -m bench.cross_encoder_teacher --base /work/teacher/all-mpnet-base-v2 \\
        [--train ../shared/data/twitter-url/train.tsv] [--mined mined.parquet] \\
        [--epochs 1] [--batch-size 32] [--lr 2e-5] [--seed 1] \\
        [--first-stage MODEL_DIR] [--dev ../shared/data/twitter-url/dev-distractors] \\
        [--depth 50] [--out runs/cross-encoder-teacher] [--results FILE.jsonl]
    python -m bench.cross_encoder_teacher --cross-encoder DIR ...   # score one already trained
    python -m bench.cross_encoder_teacher --base ... --max-minutes 60 --bf16   # train in slices

A teacher that takes longer to train than one sitting allows (all-mpnet-base-v2 for one epoch on
two CPU cores: hours) trains in slices: ``--max-minutes`` stops after the step that passes the
limit and leaves a checkpoint in ``--out`` (weights, optimizer, scheduler, data order and random
state, the Hugging Face trainer's own); the same command again goes on from it, and scores the
teacher once the last step is done. The seconds of every slice add up in the row it writes.
``--bf16`` trains and scores in bf16 autocast, where the device computes bf16 natively (1.75x
the fp32 step of sentence-transformers' own trainer on this project's CPUs, docs/benchmarks.md).

The teacher is sentence-transformers' ``CrossEncoder`` (one label, ``BinaryCrossEntropyLoss``,
its ``CrossEncoderTrainer``) started from ``--base``'s encoder, trained on the headerless
``sentence1<TAB>sentence2<TAB>label`` rows of ``--train`` (Twitter URL: label 0 marks a tweet
about the same link that annotators judged no paraphrase, a natural hard negative) and, with
``--mined``, on ``jobs/mine.py``'s negatives as label 0 too. Each pair is read at twice
``--max-seq-len`` tokens, as the refresh's teacher reads it.

The score: each query's ``--depth`` nearest documents under the first stage (default: the
all-MiniLM-L6-v2 of the ``minilm`` extra), reordered by the teacher's logit, then the rest in the
first stage's order, measured by the project's own ranking metrics
(:func:`~pipeline.evaluation.retrieval_metrics.ranking_metrics`: nDCG@10, MRR@10, R@1/10/100,
the query's own text never a candidate), so that the numbers read beside ``jobs/evaluate.py``'s.
The first stage alone is scored the same way in the same run. One JSON row per run goes to
``--results`` (the teacher rows of docs/results.md).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from bench.common import DATA, argument_parser, default_model_dir
from bench.hard_negatives import git_commit

TWITTER = DATA / "twitter-url"
RANK_ANGLES = (math.pi / 4, 3 * math.pi / 4)
"""The angles a query's ranked documents are laid on, best first (:func:`ranked_vectors`): where
the cosine falls steeply enough that consecutive ranks differ by far more than the metrics' tie
tolerance, at 33,114 documents about 3e-5."""


def labelled_pairs(path: Path) -> tuple[list[str], list[str], list[float]]:
    """The ``sentence1<TAB>sentence2<TAB>label`` rows of a headerless file (label 0 or 1)."""
    left, right, labels = [], [], []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 3 and fields[0] and fields[1] and fields[2] in ("0", "1"):
                left.append(fields[0])
                right.append(fields[1])
                labels.append(float(fields[2]))
    if not labels:
        raise SystemExit(f"{path}: no sentence1<TAB>sentence2<TAB>label rows")
    return left, right, labels


def mined_negative_pairs(path: Path) -> tuple[list[str], list[str]]:
    """Each (anchor, negative) of ``jobs/mine.py``'s output (``anchor``, ``negative_1`` ...)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    anchors = table.column("anchor").to_pylist()
    left, right = [], []
    for name in (c for c in table.column_names if c.startswith("negative_")):
        for anchor, negative in zip(anchors, table.column(name).to_pylist(), strict=True):
            if negative:
                left.append(anchor)
                right.append(negative)
    return left, right


@dataclass(frozen=True)
class TeacherTraining:
    """Where a training of the teacher stands after one call of :func:`train_cross_encoder`."""

    model_dir: Path | None
    """The trained teacher's folder; None while steps remain (a slice stopped by ``--max-minutes``)."""
    seconds: float
    """Training seconds over every slice so far."""
    pairs: int
    step: int
    steps: int


def train_cross_encoder(args: Any, out: Path) -> TeacherTraining:
    """Train the teacher into ``out``, going on from the last checkpoint there if a slice left one;
    with ``args.max_minutes`` set, stop (and checkpoint) after the step that passes it."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import set_seed
    from transformers.trainer_utils import get_last_checkpoint

    left, right, labels = labelled_pairs(args.train)
    if args.mined is not None:
        mined_left, mined_right = mined_negative_pairs(args.mined)
        left, right, labels = left + mined_left, right + mined_right, labels + [0.0] * len(mined_left)
    # The new one-label head draws its weights from torch's global generator: seeded here, so that
    # --seed decides them rather than whatever ran before in the process.
    set_seed(args.seed)
    model = CrossEncoder(str(args.base), num_labels=1, max_length=2 * args.max_seq_len)
    rows = Dataset.from_dict({"sentence1": left, "sentence2": right, "label": labels})
    folder = out / "trainer"
    training = CrossEncoderTrainingArguments(
        output_dir=str(folder), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=0.1, seed=args.seed, save_strategy="no", save_total_limit=1,
        report_to="none", logging_steps=100, dataloader_drop_last=False, bf16=args.bf16,
        # Without a GPU, bf16 autocast on the CPU is asked for by name.
        use_cpu=args.bf16 and not torch.cuda.is_available(),
    )  # fmt: skip
    trainer = CrossEncoderTrainer(
        model=model, args=training, train_dataset=rows, loss=BinaryCrossEntropyLoss(model)
    )
    if args.max_minutes is not None:
        trainer.add_callback(StopAfter(args.max_minutes * 60))
    resume = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if resume is not None:
        print(f"[teacher] going on from {resume}", flush=True)
    slices = folder / "slice_seconds.json"
    seconds = json.loads(slices.read_text()) if resume is not None and slices.is_file() else []
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds.append(time.perf_counter() - started)
    folder.mkdir(parents=True, exist_ok=True)
    slices.write_text(json.dumps(seconds))
    step, steps = trainer.state.global_step, trainer.state.max_steps
    done = step >= steps
    if done:
        model.save_pretrained(str(out / "model"))
        # The slices' checkpoints are spent: the same command again trains anew.
        for checkpoint in folder.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    return TeacherTraining(out / "model" if done else None, sum(seconds), len(labels), step, steps)


class StopAfter(TrainerCallback):
    """Ends training, with a checkpoint, after the first step past ``seconds`` (the trainer's own
    checkpoint: :func:`train_cross_encoder` goes on from it)."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if time.monotonic() >= self.deadline and state.global_step < state.max_steps:
            control.should_save = True
            control.should_training_stop = True
        return control


def ranked_vectors(tier: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``(docs, 2)`` unit vectors whose cosine with ``(1, 0)`` orders the documents by ``tier``,
    then ``value`` (both higher first), documents within the metrics' tie tolerance of each other
    in a tier sharing one vector: a ranking that
    :func:`~pipeline.evaluation.retrieval_metrics.ranking_metrics` reads as it reads a first
    stage's cosines, its ties broken in expectation as there."""
    from pipeline.evaluation.retrieval_metrics import TIE_TOLERANCE

    value = np.where(np.isfinite(value), value, -1e300)  # an excluded document: last, never a candidate
    order = np.lexsort((-value, -tier))
    tiers, values = tier[order], value[order]
    starts = np.concatenate([[True], (np.diff(tiers) != 0) | (np.abs(np.diff(values)) > TIE_TOLERANCE)])
    rank = np.empty(len(order), dtype=np.float64)
    rank[order] = np.cumsum(starts) - 1
    low, high = RANK_ANGLES
    angle = low + (high - low) * (rank + 1) / (rank.max(initial=0) + 2)
    return np.stack([np.cos(angle), np.sin(angle)], axis=1)


def reranked_metrics(
    *,
    unit_queries: np.ndarray,
    unit_docs: np.ndarray,
    relevance: list[dict[int, float]],
    excluded: list[list[int]],
    rerank: Any,
    depth: int,
) -> tuple[dict[str, float], int]:
    """The ranking metrics of the first stage's cosines (``unit_queries`` against ``unit_docs``)
    with each query's ``depth`` best candidates (its ``excluded`` documents never one) reordered
    by ``rerank(queries, documents)``: the scores of the pairs ``(queries[i], documents[i])``,
    every query's candidates asked in one call (higher first; equal scores stay tied, as the
    first stage's ties do). Returns the metrics averaged over the scored queries, and the pairs reranked."""
    from pipeline.evaluation.retrieval_metrics import ranking_metrics

    first_stage, heads = [], []
    for q in range(len(unit_queries)):
        cosines = unit_docs @ unit_queries[q]
        cosines[excluded[q]] = -np.inf
        first_stage.append(cosines)
        heads.append(np.argsort(-cosines, kind="stable")[: min(depth, len(cosines) - len(excluded[q]))])
    asked = np.repeat(np.arange(len(heads)), [len(h) for h in heads])
    scores = np.asarray(rerank(asked, np.concatenate(heads)), dtype=np.float64) if len(asked) else asked
    per_query, at = [], 0
    for q, (cosines, head) in enumerate(zip(first_stage, heads, strict=True)):
        # The reranked head above every other document, in the teacher's order; the rest in the first stage's.
        tier, value = np.zeros(len(cosines)), cosines.copy()
        tier[head], value[head] = 1.0, scores[at : at + len(head)]
        at += len(head)
        got = ranking_metrics(
            np.array([[1.0, 0.0]]), ranked_vectors(tier, value), [relevance[q]], [excluded[q]]
        )
        if got.queries:
            per_query.append(asdict(got))
    names = ("ndcg_at_10", "mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100")
    return {name: float(np.mean([m[name] for m in per_query])) for name in names} | {
        "queries": len(per_query)
    }, len(asked)


def first_stage_vectors(
    model_dir: Path, spec: str, max_seq_len: int
) -> tuple[Any, np.ndarray, np.ndarray, list]:
    """The retrieval set, its queries' and documents' unit vectors under ``model_dir``, and each
    query's own-text documents (never its candidates), as ``jobs/evaluate.py`` encodes them
    (:func:`~pipeline.evaluation.retrieval_scoring.encoded_eval_set`, ``set_vectors``)."""
    from pipeline.evaluation.retrieval_scoring import encoded_eval_set, set_vectors

    eval_set, embeddings = encoded_eval_set(model_dir, [spec], max_seq_len=max_seq_len)
    ((queries, docs, excluded),) = set_vectors(eval_set, embeddings)
    return eval_set.sets[0], queries, docs, excluded


def main(argv: list[str] | None = None) -> None:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    teacher = parser.add_mutually_exclusive_group(required=True)
    teacher.add_argument("--base", type=Path, help="an encoder folder the cross-encoder starts from")
    teacher.add_argument("--cross-encoder", type=Path, help="a trained one-label cross-encoder folder")
    parser.add_argument("--train", type=Path, default=TWITTER / "train.tsv")
    parser.add_argument("--mined", type=Path, default=None, help="jobs/mine.py output: more label-0 pairs")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seq-len", type=int, default=32, help="tokens a text; a pair reads twice that")
    parser.add_argument("--first-stage", type=Path, default=None, help="default: the minilm extra's model")
    parser.add_argument("--dev", default=str(TWITTER / "dev-distractors"))
    parser.add_argument("--depth", type=int, default=50, help="first-stage candidates the teacher reorders")
    parser.add_argument("--out", type=Path, default=Path("runs/cross-encoder-teacher"))
    parser.add_argument("--results", type=Path, default=None, help="append the run's JSON row here")
    parser.add_argument(
        "--max-minutes", type=float, default=None,
        help="train this long, then checkpoint in --out and stop; the same command goes on from there",
    )  # fmt: skip
    parser.add_argument("--bf16", action="store_true", help="train and score in bf16 autocast")
    args = parser.parse_args(argv)
    from pipeline.model.folders import quiet_libraries

    quiet_libraries()
    first_stage = args.first_stage or default_model_dir()
    train_s, pairs_trained = None, None
    if args.cross_encoder is None:
        trained = train_cross_encoder(args, args.out)
        train_s, pairs_trained = trained.seconds, trained.pairs
        if trained.model_dir is None:
            print(
                f"[teacher] step {trained.step:,} of {trained.steps:,} after {train_s:.0f}s of training; "
                f"checkpoint in {args.out / 'trainer'}: run the same command again to go on",
                flush=True,
            )
            return
        print(
            f"[teacher] trained on {pairs_trained:,} pairs in {train_s:.0f}s -> {trained.model_dir}",
            flush=True,
        )
        model_dir = trained.model_dir
    else:
        model_dir = args.cross_encoder
    from sentence_transformers.cross_encoder import CrossEncoder

    cross_encoder = CrossEncoder(str(model_dir), max_length=2 * args.max_seq_len)
    retrieval_set, query_vectors, doc_vectors, excluded = first_stage_vectors(
        first_stage, args.dev, args.max_seq_len
    )
    alone, _ = reranked_metrics(
        unit_queries=query_vectors, unit_docs=doc_vectors, relevance=retrieval_set.relevance, excluded=excluded,
        rerank=lambda query_rows, doc_rows: np.zeros(len(query_rows)), depth=0,
    )  # fmt: skip
    import torch

    def rerank(query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
        texts = retrieval_set.queries, retrieval_set.docs
        pairs = [(texts[0][q], texts[1][d]) for q, d in zip(query_rows, doc_rows, strict=True)]
        device = torch.device(cross_encoder.device).type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=args.bf16):
            scores = cross_encoder.predict(
                pairs, batch_size=64, activation_fn=torch.nn.Identity(), show_progress_bar=False,
                convert_to_tensor=True,
            )  # fmt: skip
        return scores.float().cpu().numpy()

    started = time.perf_counter()
    reranked, pairs_scored = reranked_metrics(
        unit_queries=query_vectors, unit_docs=doc_vectors, relevance=retrieval_set.relevance, excluded=excluded,
        rerank=rerank, depth=args.depth,
    )  # fmt: skip
    rerank_s = time.perf_counter() - started
    header = "| ranking | nDCG@10 | MRR@10 | R@1 | R@10 | R@100 |"
    lines = [header, "|---|---|---|---|---|---|"]
    for label, m in (("first stage alone", alone), (f"teacher reranking its top {args.depth}", reranked)):
        lines.append(
            f"| {label} | {m['ndcg_at_10']:.2f} | {m['mrr_at_10']:.2f} | {m['recall_at_1']:.2f} | "
            f"{m['recall_at_10']:.2f} | {m['recall_at_100']:.2f} |"
        )
    print("\n".join(lines))
    print(
        f"{pairs_scored:,} pairs reranked in {rerank_s:.0f}s; {retrieval_set.name}: {alone['queries']} queries"
    )
    if args.results is not None:
        row = {
            "arm": "teacher-cross-encoder", "seed": args.seed, "base": str(args.base or args.cross_encoder),
            "first_stage": str(first_stage), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
            "train": {"pairs": pairs_trained, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                      "mined": str(args.mined) if args.mined else None, "seconds": train_s, "bf16": args.bf16},
            "depth": args.depth, "rerank_s": rerank_s, "set": args.dev, "first_stage_alone": alone,
            "reranked": reranked,
        }  # fmt: skip
        with args.results.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
