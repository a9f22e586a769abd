"""What an in-batch distillation term (TAS-B's, over the global batch's candidates) would have
to teach beyond the label: a teacher's and a student's distributions over each anchor's batch.

The KL term the recipe has (``train.distill_weight``) reads the teacher over a row's positive
and its mined negatives only; ``bench.teacher_targets`` shows that target is nearly InfoNCE's
one-hot label. An in-batch term would read the teacher over every positive of the batch as well.
This encodes the pairs (label-1 rows of a ``pairs_tsv`` file) with each model folder, cuts them
into seeded random batches of ``--batch-size`` rows, the global batch (a permutation cut into
whole batches, not ``random_plan``'s balanced sizes: the last partial batch is left out),
and reads each model's softmax(cos / T) over the batch's positives (columns of other rows with the
same positive or the same anchor are left out: false negatives). For each model: the mean
probability on the row's positive, the share of rows above 0.95, the mean normalised entropy of
the rest; and the mean KL(teacher || model) per row, what the term would pull towards.

    python -m bench.in_batch_targets --pairs ../shared/data/twitter-url/train.tsv \\
        --models runs/teacher/model,STUDENT_DIR [--batch-size 64] [--temperatures 0.05,0.1]

The first model is the teacher.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.common import POSITIVE_LABEL, read_pair_file
from pipeline.evaluation.folder_encoder import FolderEncoder


def read_pairs(path: Path) -> tuple[list[str], list[str]]:
    """The label-1 (anchor, positive) rows of a headerless ``anchor<TAB>positive<TAB>label`` file."""
    rows = [(anchor, positive) for anchor, positive, label in read_pair_file(path) if label == POSITIVE_LABEL]
    return [anchor for anchor, _ in rows], [positive for _, positive in rows]


def batch_distributions(
    anchors: np.ndarray, positives: np.ndarray, same: np.ndarray, temperature: float
) -> np.ndarray:
    """``(b, b)`` softmax over one batch: row ``i`` the anchor's distribution over the batch's
    positives at ``temperature``, column ``i`` its own; ``same`` ``(b, b)`` marks, for row ``i``, the columns of
    rows with its positive's text or its anchor's: the others among them are left out, false
    negatives rather than negatives."""
    logits = anchors @ positives.T / temperature
    logits = np.where(same & ~np.eye(len(same), dtype=bool), -np.inf, logits)
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=1, keepdims=True)


def summary(probs: np.ndarray, teacher: np.ndarray) -> dict[str, float]:
    """The statistics of the module docstring over rows' ``(n, b)`` distributions, own column at
    the diagonal position given by ``probs``' first axis modulo ``b``."""
    n, b = probs.shape
    own = probs[np.arange(n), np.arange(n) % b]
    rest = probs.copy()
    rest[np.arange(n), np.arange(n) % b] = 0.0
    rest /= np.maximum(rest.sum(axis=1, keepdims=True), 1e-30)
    entropy = -(rest * np.log(np.where(rest > 0, rest, 1.0))).sum(axis=1) / np.log(b - 1)
    kl = (teacher * (np.log(np.maximum(teacher, 1e-30)) - np.log(np.maximum(probs, 1e-30)))).sum(axis=1)
    return {
        "p(positive)": float(own.mean()),
        "rows above 0.95": float((own > 0.95).mean()),
        "rest's entropy (0-1)": float(entropy.mean()),
        "KL(teacher || it)": float(kl.mean()),
    }


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, required=True)
    parser.add_argument(
        "--models", required=True, help="model folders, comma-separated; the first is the teacher"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--temperatures", default="0.05,0.1")
    parser.add_argument("--max-seq-len", type=int, default=32, help="the recipe's data.max_seq_len")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    anchors, positives = read_pairs(args.pairs)
    folders = args.models.split(",")
    vectors = {}
    for folder in folders:
        encoder = FolderEncoder.load(folder, max_seq_len=args.max_seq_len)
        vectors[folder] = (unit(encoder.encode_texts(anchors)), unit(encoder.encode_texts(positives)))
    b = args.batch_size
    order = np.random.default_rng(args.seed).permutation(len(anchors))
    batches = [order[i : i + b] for i in range(0, len(order) - b + 1, b)]  # whole batches only
    # Another row with the same positive, or the same anchor (a headline with several tweets), is
    # a false negative in the batch, not a negative.
    positive_ids = np.unique(np.array(positives, dtype=object), return_inverse=True)[1]
    anchor_ids = np.unique(np.array(anchors, dtype=object), return_inverse=True)[1]
    print(f"{len(anchors):,} pairs, {len(batches)} batches of {b} (seed {args.seed})")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        probs = {folder: [] for folder in folders}
        for rows in batches:
            same = (positive_ids[rows][:, None] == positive_ids[rows][None, :]) | (
                anchor_ids[rows][:, None] == anchor_ids[rows][None, :]
            )
            for folder in folders:
                a, p = vectors[folder]
                probs[folder].append(batch_distributions(a[rows], p[rows], same, temperature))
        stacked = {folder: np.concatenate(parts) for folder, parts in probs.items()}
        teacher = stacked[folders[0]]
        rows = {folder: summary(stacked[folder], teacher) for folder in folders}
        names = list(next(iter(rows.values())))
        print(f"\nT = {temperature:g}\n| model | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
        for folder, values in rows.items():
            print(f"| {folder} | " + " | ".join(f"{values[n]:.3f}" for n in names) + " |")


if __name__ == "__main__":
    main()
