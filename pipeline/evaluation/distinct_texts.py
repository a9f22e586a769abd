"""Evaluation texts tokenized once: the base of the STS and retrieval eval sets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.data.tokenize import tokenize_table
from pipeline.data.tokenized import TokenizedCorpus


class DistinctTexts:
    """Several groups of texts with each distinct text tokenized once, and where each group's
    texts sit among them.

    ``table`` is a pyarrow table (``text``, ``input_ids``) that pickles cheaply into Ray's
    object store; rows are in first-seen order, and equal texts share a row (which is how a
    retrieval query's own text is found in its corpus).

    Args:
        groups: per group two text lists: an STS file's two sides, a retrieval set's queries
            and documents.
    """

    def __init__(self, groups: list[tuple[Sequence[str], Sequence[str]]], tokenizer: Any, max_seq_len: int):
        position: dict[str, int] = {}

        def rows_of(texts: Sequence[str]) -> np.ndarray:
            return np.asarray([position.setdefault(t, len(position)) for t in texts], dtype=np.int64)

        self.rows: list[tuple[np.ndarray, np.ndarray]] = [(rows_of(a), rows_of(b)) for a, b in groups]
        """Per group: the rows of its first and of its second list."""
        self.table = tokenize_table(pa.table({"text": list(position)}), tokenizer, max_seq_len)
        self.pad_token_id = tokenizer.pad_token_id

    @property
    def num_sentences(self) -> int:
        return self.table.num_rows

    def corpus(self) -> TokenizedCorpus:
        return TokenizedCorpus(self.table, self.pad_token_id)
