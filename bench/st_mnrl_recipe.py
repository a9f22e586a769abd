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
row without a label column) as (anchor, positive). ``--max-rows`` picks the rows the pipeline picks (``data.max_rows``). MNRL's
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
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import argument_parser

POSITIVE_LABEL = 1
"""The label of a paraphrase (positive) row in a headerless pair file."""
ALL_ROWS = "all-rows"
"""``--mining-corpus``: the second column of every row of the ``--train`` pair file."""


def read_pair_file(path: str | Path) -> list[tuple[str, str, int]]:
    """A headerless tab-separated pair file as it is: ``(sentence1, sentence2, label)`` per
    line, stripped, quoting off (a ``"`` is text); a line of two columns is a positive pair.

    Raises:
        ValueError: a line without two or three columns, or whose label is not an integer,
            naming the line.
    """
    import csv

    rows = []
    with open(path, encoding="utf-8", newline="") as handle:
        for number, fields in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not fields:
                continue
            if len(fields) not in (2, 3):
                raise ValueError(f"{path}:{number}: {len(fields)} tab-separated columns, expected 2 or 3")
            try:
                label = int(fields[2]) if len(fields) == 3 else POSITIVE_LABEL
            except ValueError:
                raise ValueError(f"{path}:{number}: label {fields[2]!r} is not an integer") from None
            rows.append((fields[0].strip(), fields[1].strip(), label))
    return rows


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


def training_rows(path: str, max_rows: int | None) -> dict[str, list[str]]:
    """The rows ``data.max_rows`` selects: for text, distinct stripped sentences ordered by the
    pipeline's content hash; for jsonl, the first rows with a non-empty anchor and positive; for
    a ``.tsv`` pair file (:func:`read_pair_file`), the first label-1 rows with both texts
    non-empty."""
    from pipeline.data.utf8 import stable_row_id

    if path.endswith(".tsv"):
        pairs = [(a, p) for a, p, label in read_pair_file(path) if label == POSITIVE_LABEL and a and p]
        pairs = pairs[:max_rows] if max_rows else pairs
        return {"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}
    if path.endswith(".jsonl"):
        records = [
            json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
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


def mine_negatives(
    model_dir: str | Path,
    rows: dict[str, list[str]],
    settings: PeerMining,
    *,
    max_seq_len: int,
    seed: int,
    corpus: list[str] | None = None,
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``mine_hard_negatives`` on the (anchor, positive) pairs of ``rows`` with the model in
    ``model_dir`` as it starts, among ``corpus`` (None: the rows' positives; sentence-
    transformers adds the positives to a given corpus); returns the rows that got
    ``num_negatives`` negatives, in their order, with columns ``mined_negative_1`` .. ``_n``
    after the given ones, and a report (``mined_anchors``, ``mining_rows_in``,
    ``mining_seconds``, ``mining_settings``, and ``mining_corpus``: the texts of a given
    corpus)."""
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
    started = time.perf_counter()
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):  # its progress bars
        mined = mine_hard_negatives(
            pairs, model, corpus=corpus, range_min=settings.range_min, range_max=settings.range_max,
            relative_margin=settings.relative_margin, num_negatives=settings.num_negatives,
            sampling_strategy=settings.sampling, output_format="n-tuple",
            batch_size=batch_size, use_faiss=True, verbose=False,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    # The output is one row per distinct (anchor, positive), reordered: join it back to the rows.
    found = mined.to_dict()
    negative_columns = [f"negative_{i}" for i in range(1, settings.num_negatives + 1)]
    by_pair = {
        (a, p): [found[c][i] for c in negative_columns]
        for i, (a, p) in enumerate(zip(found["anchor"], found["positive"], strict=True))
    }
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
    }
    return out, report


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
) -> Any:
    """The peer every comparison here runs: ``SentenceTransformerTrainer`` with
    ``MultipleNegativesRankingLoss(scale=20)`` (SimCSE's temperature 0.05) on ``rows``
    (``anchor``, ``positive``[, ``negative``]), linear warm-up over ``warmup_ratio`` of the
    steps then linear decay, batches from sentence-transformers' ``NO_DUPLICATES`` sampler
    where ``no_duplicates`` (else its default sampler), no checkpoints, on :func:`peer_device`
    (on a GPU in bf16, as our workers' autocast; ``bf16`` asks for it on a CPU too)."""
    import datasets
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    device = peer_device()
    model = SentenceTransformer(str(model_dir), device=device)
    model.max_seq_length = max_seq_len
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
        loss=MultipleNegativesRankingLoss(model, scale=20.0),
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
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from pipeline.evaluation.scoring import evaluate_model_dir, score_summary

    rows = training_rows(args.train, args.max_rows)
    mining_report: dict[str, Any] = {}
    if args.mine_hard_negatives:
        settings = PeerMining(
            range_min=args.range_min, range_max=args.range_max if args.range_max > 0 else None,
            relative_margin=args.relative_margin if args.relative_margin >= 0 else None,
            num_negatives=args.num_negatives, sampling=args.sampling, batch_size=args.mining_batch_size,
        )  # fmt: skip
        rows, mining_report = mine_negatives(
            args.model, rows, settings, max_seq_len=args.max_seq_len, seed=args.seed,
            corpus=mining_corpus(args.mining_corpus, args.train),
        )  # fmt: skip
        if not rows["anchor"]:
            print("error: mine_hard_negatives found negatives for no row", file=sys.stderr)
            return 1
    trainer = build_mnrl_trainer(
        args.model, rows, Path(args.out) / "trainer", max_seq_len=args.max_seq_len,
        batch_size=args.batch_size, lr=args.lr, epochs=args.epochs, seed=args.seed,
        warmup_ratio=args.warmup_ratio, no_duplicates=args.no_duplicates,
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
    result = {
        "peer": "sentence-transformers MNRL" + (" on mine_hard_negatives" if mining_report else ""),
        "seed": args.seed,
        "rows": len(rows["anchor"]),
        **mining_report,
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
