"""A generated corpus of near-paraphrase groups, for the demo and the tests (no downloads).

Each group is a base sentence of pseudo-words; its members are the base with one or two
words swapped for other words and, sometimes, a filler word added. Members of a group share
most of their tokens, so they are each other's nearest neighbours even for a randomly
initialised encoder with mean pooling; different groups share few.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config.data_section import GENERATED_GROUP_SIZE

GENERATED_CORPUS_FILE = "generated_corpus.txt"
GENERATED_STS_FILE = "generated_sts.tsv"
"""The files a run without ``data.path`` writes into its run folder."""
GENERATED_STS_NOTE = (
    "generated: its gold score is the word overlap of the two sentences, which an untrained "
    "encoder already follows, so it shows that the pipeline runs, not that the model improved"
)
"""What the generated STS set measures, said wherever its score is reported."""

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr", "pl"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_FILLERS = ["the", "a", "of", "and", "then", "very", "so", "just"]


def _vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.integers(2, 4)
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)))
    return sorted(words)


def generate_paraphrase_corpus(
    num_groups: int, seed: int = 0, words_per_sentence: int = 9
) -> tuple[list[str], np.ndarray]:
    """Generate ``num_groups * GENERATED_GROUP_SIZE`` distinct sentences in paraphrase groups.

    Returns:
        ``(sentences, group)`` where ``group[i]`` is the group index of ``sentences[i]``.
        Sentences are shuffled so that groups are not contiguous.
    """
    rng = np.random.default_rng(seed)
    vocab = np.array(_vocabulary(max(400, num_groups * 3), rng))
    fillers = np.array(_FILLERS)
    sentences: list[str] = []
    groups: list[int] = []
    seen: set[str] = set()
    for g in range(num_groups):
        base = vocab[rng.choice(len(vocab), size=words_per_sentence, replace=False)].tolist()
        made = 0
        while made < GENERATED_GROUP_SIZE:
            words = list(base)
            for _ in range(rng.integers(1, 3)):
                words[rng.integers(len(words))] = vocab[rng.integers(len(vocab))]
            if rng.random() < 0.5:
                words.insert(int(rng.integers(len(words) + 1)), fillers[rng.integers(len(fillers))])
            text = " ".join(words).capitalize() + "."
            if text in seen:
                continue
            seen.add(text)
            sentences.append(text)
            groups.append(g)
            made += 1
    order = rng.permutation(len(sentences))
    return [sentences[i] for i in order], np.asarray(groups)[order]


def write_generated_corpus(path: str | Path, num_groups: int) -> int:
    """Write a generated corpus as one sentence per line, with the messiness real files have.

    A few blank lines, stray whitespace and exact repeats are mixed in so that the cleaning
    stage has something to do. Returns the number of lines written.
    """
    sentences, _ = generate_paraphrase_corpus(num_groups)
    rng = np.random.default_rng(1)
    lines: list[str] = []
    for text in sentences:
        lines.append(f"  {text} " if rng.random() < 0.05 else text)
        if rng.random() < 0.02:
            lines.append("")
        if rng.random() < 0.02:
            lines.append(text)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def write_generated_sts(path: str | Path, num_groups: int, num_pairs: int) -> int:
    """Write an STS file (STS-B's tab-separated layout) over the generated corpus's sentences.

    Half the pairs come from one paraphrase group, half from two; the gold score is 5 x the
    Jaccard overlap of the two sentences' word sets, so it is graded and an encoder that
    learns the group structure ranks pairs well. Returns the number of pairs written.
    """
    sentences, group = generate_paraphrase_corpus(num_groups)
    rng = np.random.default_rng(2)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group.tolist()):
        members.setdefault(g, []).append(i)
    lines = []
    for k in range(num_pairs):
        if k % 2 == 0:
            a, b = rng.choice(members[int(rng.integers(num_groups))], size=2, replace=False)
        else:
            a, b = rng.choice(len(sentences), size=2, replace=False)
        words_a = set(sentences[a].lower().rstrip(".").split())
        words_b = set(sentences[b].lower().rstrip(".").split())
        score = 5.0 * len(words_a & words_b) / len(words_a | words_b)
        lines.append(f"generated\tsynthetic\t2026\t{k:04d}\t{score:.3f}\t{sentences[a]}\t{sentences[b]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)
