"""What a teacher's scores of the training rows leave the student to learn: the distribution
its KL term (``train.distill_weight``) pulls each row towards.

A pairs refresh with a teacher writes its scores beside the negatives column
(``<run storage>/<run>/mined/v<N>-negatives.npz``: ``negatives`` and ``teacher_scores``,
the positive's score first). Read at a teacher temperature ``T_t`` (the KL target is
``softmax(scores / T_t)`` over the positive and the row's present negatives), the table says how
close that target is to InfoNCE's own one-hot label: the mean probability on the positive, the
share of rows where it passes 0.95, and, where a row holds several negatives, how evenly the
teacher spreads the rest among them (normalised entropy: 0 one negative takes it all, 1 even).
A target near one-hot distils little beyond the label the student already trains on.

    python -m bench.teacher_targets runs/.../mined/v1-negatives.npz [--temperatures 0.05,0.1,0.2]
"""

from __future__ import annotations

import argparse

import numpy as np

from pipeline.training.plan_source import read_mined


def read_scored_column(uri: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``(rows, m)`` negatives and ``(rows, 1 + m)`` teacher scores a refresh wrote to ``uri``."""
    column = read_mined(uri)
    if column.teacher_scores is None:
        raise SystemExit(
            f"{uri}: no teacher_scores beside its negatives (a refresh without mining.teacher.model)"
        )
    return column.negatives, column.teacher_scores


def target_summary(scores: np.ndarray, present: np.ndarray, temperature: float) -> dict[str, float]:
    """The KL target at ``temperature`` over each row's positive and its ``present`` negatives
    (``(rows, m)`` bool), over the rows with at least one: see the module docstring."""
    rows = present.any(axis=1)
    logits = np.where(np.concatenate([np.ones((len(present), 1), bool), present], axis=1), scores, -np.inf)
    logits = logits[rows] / temperature
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    summary = {
        "rows": float(rows.sum()),
        "p(positive)": float(probs[:, 0].mean()),
        "rows with p(positive) > 0.95": float((probs[:, 0] > 0.95).mean()),
        "rows ranking a negative first": float((probs[:, 1:].max(axis=1) > probs[:, 0]).mean()),
    }
    counts = present[rows].sum(axis=1)
    several = counts > 1
    if several.any():
        rest = probs[several, 1:] / probs[several, 1:].sum(axis=1, keepdims=True)
        entropy = -(rest * np.log(np.where(rest > 0, rest, 1.0))).sum(axis=1) / np.log(counts[several])
        summary["negatives' entropy (0-1)"] = float(entropy.mean())
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("column", nargs="+", help="v<N>-negatives.npz files (local paths or URIs)")
    parser.add_argument("--temperatures", default="0.05,0.1,0.2", help="teacher temperatures T_t to read at")
    args = parser.parse_args(argv)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    for uri in args.column:
        negatives, scores = read_scored_column(uri)
        present = (negatives >= 0) & np.isfinite(scores[:, 1:])
        margins = (scores[:, :1] - np.where(present, scores[:, 1:], np.nan))[present]
        print(f"\n{uri}: {len(negatives)} rows, {negatives.shape[1]} negatives a row, "
              f"teacher margin (positive less negative) median {np.median(margins):.3f}")  # fmt: skip
        table = {t: target_summary(scores, present, t) for t in temperatures}
        names = list(next(iter(table.values())))
        print("| T_t | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for t, summary in table.items():
            print(
                f"| {t:g} | "
                + " | ".join(f"{summary[n]:.3f}" if n != "rows" else f"{summary[n]:,.0f}" for n in names)
                + " |"
            )


if __name__ == "__main__":
    main()
