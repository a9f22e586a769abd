"""The tokenized corpus as the workers and the miner hold it: padded batches by row index,
row lengths, and the digest that names the dataset in MLflow.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.data.triplets import Triplets


def sorted_by_id(tables: list[pa.Table]) -> pa.Table:
    """Blocks gathered into one table in id order: position ``i`` is the ``i``-th smallest id,
    whatever order the blocks came in."""
    table = pa.concat_tables(tables)
    return table.take(pa.array(np.argsort(table.column("id").to_numpy(), kind="stable"))).combine_chunks()


@dataclass(frozen=True)
class TokenizedBlocks:
    """The tokenized corpus as it travels: object refs of ``(id, input_ids, text_key, ...)``
    blocks in the object store (:func:`~pipeline.data.tokenize.tokenize_texts`). The driver never
    gathers them; each worker and the miner assembles its own copy with :meth:`table`."""

    refs: list[Any]

    def table(self) -> pa.Table:
        """``(id, input_ids, text_key)`` sorted by id: position ``i`` is the ``i``-th smallest
        id, as in :class:`~pipeline.data.triplets.Triplets`."""
        import ray  # deferred: the evaluate job imports this module without Ray

        return sorted_by_id([t.select(["id", "input_ids", "text_key"]) for t in ray.get(self.refs)])


class TokenizedCorpus:
    """Position-addressed view of the tokenized table, shared by training and mining.

    Holds numpy views of the Arrow buffers (no copy when the table came from the object
    store) and pads any set of rows into a batch.
    """

    def __init__(self, table: pa.Table, pad_token_id: int):
        tokens = table.column("input_ids").combine_chunks()
        self.ids = table.column("id").to_numpy() if "id" in table.column_names else np.arange(table.num_rows)
        self.offsets = tokens.offsets.to_numpy()
        self.values = tokens.values.to_numpy()
        self.lengths = np.diff(self.offsets)
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` of shape ``(len(rows), longest)``, right-padded."""
        lengths = self.lengths[rows]
        width = int(lengths.max())
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.arange(width)[None, :] < lengths[:, None]
        starts = self.offsets[rows]
        input_ids[mask] = self.values[(starts[:, None] + np.arange(width)[None, :])[mask]]
        return input_ids, mask.astype(np.int64)


def row_lengths(corpus: TokenizedCorpus, triplets: Triplets | None = None) -> np.ndarray:
    """Tokens per training row, i.e. the width a row forces on its padded batch: a sentence's
    length, or for a triplet row the longer of its anchor and positive."""
    lengths = padded_lengths(corpus, triplets)
    return lengths if lengths.ndim == 1 else lengths.max(axis=1)


def padded_lengths(corpus: TokenizedCorpus, triplets: Triplets | None = None) -> np.ndarray:
    """Tokens of each training row in each group the train step pads on its own:
    ``(num_rows,)`` for sentences, ``(num_rows, 2)`` for triplet rows (anchor, positive; the
    negatives, padded with the positives, are left out)."""
    if triplets is None:
        return corpus.lengths
    return np.stack([corpus.lengths[triplets.anchor], corpus.lengths[triplets.positive]], axis=1)


def dataset_digest(ids: np.ndarray, triplets: Triplets | None = None) -> str:
    """A content fingerprint of the cleaned training data, from its sorted distinct text ids:
    the same sentences (and, for triplets, the same rows) give the same digest whatever the
    file's name or row order."""

    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.sort(ids).astype("<i8").tobytes())
    if triplets is not None:
        rows = np.stack([ids[triplets.anchor], ids[triplets.positive],
                         np.where(triplets.negative >= 0, ids[np.maximum(triplets.negative, 0)], -1)], axis=1)  # fmt: skip
        digest.update(rows[np.lexsort(rows.T[::-1])].astype("<i8").tobytes())
    return digest.hexdigest()
