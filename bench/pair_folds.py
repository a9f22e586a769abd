"""Split a ``pairs_tsv`` file (headerless ``anchor<TAB>positive<TAB>label``) into folds by
anchor, for a cross-fitted teacher: a teacher trained on one fold scores the rows of another,
pairs it has never fit (docs/results.md, "A cross-fitted teacher").

Every row of an anchor lands in the same fold (its positives and its label-0 rows alike), so a
teacher trained on fold ``i`` has seen none of fold ``j``'s anchors. The fold is the MD5 of the
anchor, stripped and lower-cased, modulo ``--folds``: stable across machines and Python runs.

    python -m bench.pair_folds --pairs ../shared/data/twitter-url/train.tsv --folds 2 --out DIR

writes ``DIR/fold0.tsv`` ... and prints each fold's rows and labelled pairs.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path


def fold_of(anchor: str, folds: int) -> int:
    """The fold of an anchor's rows: MD5 of the stripped, lower-cased text, modulo ``folds``."""
    return int(hashlib.md5(anchor.strip().lower().encode("utf-8")).hexdigest(), 16) % folds


def split_pairs(source: Path, folds: int, out: Path) -> list[dict[str, int]]:
    """Write ``out/fold<i>.tsv`` for each fold, lines as they are; returns per fold the lines
    written and those labelled 1."""
    out.mkdir(parents=True, exist_ok=True)
    counts = [{"rows": 0, "positives": 0} for _ in range(folds)]
    files = [(out / f"fold{i}.tsv").open("w", encoding="utf-8", newline="") for i in range(folds)]
    try:
        with source.open(encoding="utf-8", newline="") as f:
            for line in f:
                fields = line.rstrip("\r\n").split("\t")
                i = fold_of(fields[0], folds)
                files[i].write(line if line.endswith("\n") else line + "\n")
                counts[i]["rows"] += 1
                counts[i]["positives"] += len(fields) > 2 and fields[2].strip() == "1"
    finally:
        for handle in files:
            handle.close()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, required=True)
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.folds < 2:
        parser.error("--folds must be at least 2")
    for i, count in enumerate(split_pairs(args.pairs, args.folds, args.out)):
        print(
            f"fold {i}: {count['rows']} rows, {count['positives']} labelled 1 -> {args.out / f'fold{i}.tsv'}"
        )


if __name__ == "__main__":
    main()
