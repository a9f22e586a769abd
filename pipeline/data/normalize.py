"""What makes two texts "the same sentence" for the negative filters: equal after
:func:`normalize_text`. Computed where the texts are tokenized, so that the miner compares
integer keys and never needs the texts."""

from __future__ import annotations

import re
import unicodedata

import pyarrow as pa

from pipeline.data.utf8 import stable_row_id


def normalize_text(text: str) -> str:
    """Key for "the same sentence up to case, Unicode compatibility forms (NFKC), whitespace
    and punctuation". Accents count: "café" and "cafe" are two sentences."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[^\w\s]", "", text)
    return " ".join(text.split())


def normalized_id(text: str) -> int:
    """:func:`~pipeline.data.utf8.stable_row_id` of :func:`normalize_text`: equal for texts
    that are the same sentence (:func:`normalize_text`)."""
    return stable_row_id(normalize_text(text))


def with_text_keys(table: pa.Table) -> pa.Table:
    """``table`` with a ``text_key`` column: :func:`normalized_id` of its ``text``."""
    keys = [normalized_id(t) for t in table.column("text").to_pylist()]
    return table.append_column("text_key", pa.array(keys, pa.int64()))
