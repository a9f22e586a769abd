"""Which labelled texts the mined negatives of a labelled pair file are.

    python -m bench.mined_negative_labels --mined mined.parquet --pairs train.tsv

``--mined``: ``jobs/mine.py``'s output (``anchor``, ``positive``, ``negative_1`` ...).
``--pairs``: the headerless ``sentence1<TAB>sentence2<TAB>label`` file it was mined from,
whose label-0 rows are annotated negatives of their sentence1 (the Twitter URL corpus: tweets
about the same link that annotators judged not paraphrases). Prints, for the first mined
negative of each row, the share that is one of its anchor's own label-0 texts (a negative a
person confirmed) and the share that is a label-1 text of another anchor. Texts are compared
as the miner compares them (:func:`pipeline.mining.text_keys.normalize_text`).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from bench.common import POSITIVE_LABEL, read_pair_file
from pipeline.mining.text_keys import normalize_text


@dataclass(frozen=True)
class NegativeLabels:
    """Counts over the mined rows that have a first negative."""

    rows: int
    own_label_0: int
    """Negatives that are a label-0 text of the row's own anchor."""
    other_label_1: int
    """Negatives that are a label-1 text of another anchor (never of the row's own: the miner
    excludes every known positive)."""

    def line(self) -> str:
        """The counts as one readable line."""
        share = (lambda n: f"{n} ({n / self.rows:.1%})") if self.rows else str
        return (
            f"{self.rows} mined negatives: {share(self.own_label_0)} are a label-0 text of their own anchor, "
            f"{share(self.other_label_1)} a label-1 text of another anchor"
        )


def negative_labels(
    mined: Iterable[tuple[str, str | None]], pairs: Iterable[tuple[str, str, int]]
) -> NegativeLabels:
    """Count what the mined negatives are in the labelled pairs.

    Args:
        mined: ``(anchor, first negative or None)`` per mined row.
        pairs: ``(sentence1, sentence2, label)`` rows (:func:`~bench.common.read_pair_file`),
            label 0 or 1.

    Returns:
        The counts over the rows with a negative.
    """
    own_negatives: dict[str, set[str]] = defaultdict(set)
    positives_of: dict[str, set[str]] = defaultdict(set)
    for anchor, text, label in pairs:
        target = positives_of if label == POSITIVE_LABEL else own_negatives
        target[normalize_text(anchor)].add(normalize_text(text))
    every_positive = set().union(*positives_of.values())
    rows = own = other = 0
    for anchor, negative in mined:
        if negative is None:
            continue
        rows += 1
        key, negative_key = normalize_text(anchor), normalize_text(negative)
        own += negative_key in own_negatives[key]
        other += negative_key in every_positive and negative_key not in positives_of[key]
    return NegativeLabels(rows, own, other)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mined", type=Path, required=True, help="jobs/mine.py's parquet output")
    parser.add_argument("--pairs", type=Path, required=True, help="the labelled pair file it was mined from")
    args = parser.parse_args(argv)
    table = pq.read_table(args.mined, columns=["anchor", "negative_1"]).to_pydict()
    counts = negative_labels(
        zip(table["anchor"], table["negative_1"], strict=True), read_pair_file(args.pairs)
    )
    print(counts.line())


if __name__ == "__main__":
    main()
