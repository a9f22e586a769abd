"""The ``data`` section: the corpus or pair input, its columns, the candidate pool, the
tokenizer pool, and ``data.generated``, the synthetic corpus used when no path is set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.config.check import Check

GENERATED_GROUP_SIZE = 4
"""Sentences per paraphrase group of the generated corpus. Fixed: the corpus exists for the demo
and the tests, and its size is set by ``data.generated.num_groups`` alone."""


@dataclass
class GeneratedCorpusSection:
    """A synthetic corpus of paraphrase groups, used when ``data.path`` is unset."""

    num_groups: int = 300
    """Paraphrase groups of :data:`GENERATED_GROUP_SIZE` sentences; sentences of one group
    share most of their words."""
    sts_pairs: int = 0
    """Also write an STS file of this many scored pairs over the generated sentences and
    evaluate on it first (before any ``eval.sts`` files). 0: none."""

    def checks(self) -> list[Check]:
        """This section's rules (see :data:`Check`)."""
        return [
            ("data.generated.num_groups", self.num_groups >= 1, "must be >= 1"),
            ("data.generated.sts_pairs", self.sts_pairs >= 0, "must be >= 0"),
        ]

    @property
    def sentences(self) -> int:
        """Sentences of the generated corpus (before the cleaning stage's dedup)."""
        return self.num_groups * GENERATED_GROUP_SIZE


@dataclass
class DataSection:
    path: str | None = None
    """Corpus file, directory or URI. ``None`` generates a corpus (see ``data.generated``)."""
    format: Literal["auto", "text", "csv", "tsv", "jsonl", "parquet", "pairs_tsv"] = "auto"
    """``auto`` (by extension), ``text``, ``csv``, ``tsv``, ``jsonl``, ``parquet``, or
    ``pairs_tsv``: pairs without a header, tab-separated, no quoting, 2 or 3 fields per line
    (sentence1, sentence2[, label]), as STS-B and the Twitter URL corpus are written."""
    text_column: str = "text"
    """The column of single texts in a csv/tsv/jsonl/parquet file: the corpus' sentences
    (``task: corpus``), the candidate pool's texts (``task: pairs`` with ``data.pool``)."""
    anchor_column: str = "anchor"
    """Pair inputs (``jobs/mine.py``): the anchor column."""
    positive_column: str = "positive"
    """Pair inputs: the positive column."""
    negative_column: str | None = None
    """Triplet inputs: a column of given hard negatives (e.g. NLI contradictions); empty
    cells mean none for that row."""
    label_column: str | None = None
    """Pair inputs: a column of labels, 1 (the row is an (anchor, positive) pair) or 0 (its
    second text is a given negative of its anchor). ``pairs_tsv`` files: the third field."""
    given_negatives: bool = True
    """Pair inputs: train on given negatives (label-0 rows, or ``negative_column``); false
    leaves them out."""
    pool: str | None = None
    """Pair inputs: a corpus (file, folder or URI) whose distinct texts, with the distinct
    positives, are the candidates negatives are mined from. ``None``: the distinct positives."""
    pool_format: Literal["auto", "text", "csv", "tsv", "jsonl", "parquet", "pairs_tsv"] = "auto"
    """Format of ``pool``, as ``format`` (``pairs_tsv``: every sentence2 of the file); a
    csv/tsv/jsonl/parquet pool's texts are its ``text_column``."""
    max_seq_len: int = 32
    max_rows: int | None = None
    """Train on at most this many rows: for a text corpus a fixed pseudo-random sample of the
    distinct sentences (the first by content hash), for pair files the first rows. ``None``: all."""
    tokenize_num_cpus: float = 0.25
    """CPUs reserved per Ray Data cleaning task and tokenizer actor (fractions work on small
    machines). The tokenizer pool grows from 1 actor to as many as the cluster's CPUs hold."""
    generated: GeneratedCorpusSection = field(default_factory=GeneratedCorpusSection)

    def checks(self) -> list[Check]:
        """This section's rules, ``data.generated``'s included (see :data:`Check`)."""
        return [
            ("data.max_seq_len", self.max_seq_len >= 4, "must be >= 4"),
            ("data.max_rows", self.max_rows is None or self.max_rows >= 1, "must be >= 1"),
            (
                "data.negative_column",
                not (self.negative_column and self.label_column),
                "must be unset with data.label_column (label-0 rows are the given negatives)",
            ),
            ("data.tokenize_num_cpus", self.tokenize_num_cpus > 0, "must be > 0"),
            *self.generated.checks(),
        ]
