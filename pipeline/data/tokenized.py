"""The tokenized corpus as the workers and the miner hold it: padded batches by row index,
row lengths, and the digest that names the dataset in MLflow.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.heap import release_shared_pages
from pipeline.data.triplets import Triplets


def sorted_by_id(tables: list[pa.Table]) -> pa.Table:
    """Blocks gathered into one table in id order: position ``i`` is the ``i``-th smallest id,
    whatever order the blocks came in."""
    table = pa.concat_tables(tables)
    return table.take(pa.array(np.argsort(table.column("id").to_numpy(), kind="stable"))).combine_chunks()


def large_tokens(tokens: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Token lists as one ``large_list<int32>`` array: 64-bit offsets, so a corpus past 2^31
    tokens (67M rows of 32) never overflows them. Each chunk is cast before they are joined."""
    if isinstance(tokens, pa.ChunkedArray):
        chunks = [chunk.cast(pa.large_list(pa.int32())) for chunk in tokens.chunks]
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_list(pa.int32()))
    return tokens.cast(pa.large_list(pa.int32()))


def _take_rows(block: pa.Table, rows: np.ndarray, columns: tuple[str, ...]) -> pa.Table:
    return block.select(list(columns)).take(pa.array(rows))


@dataclass(frozen=True)
class TokenizedBlocks:
    """The tokenized corpus as it travels: object refs of ``(id, input_ids, text_key, ...)``
    blocks in the object store (:func:`~pipeline.data.tokenize.tokenize_texts`), sorted by id
    across blocks. Position ``i`` (the ``i``-th smallest id, as in
    :class:`~pipeline.data.triplets.Triplets`) is row ``i - starts[k]`` of the block ``k`` whose
    range holds it, so any set of positions is found from the blocks' sizes alone.

    The driver never gathers the blocks: a train worker takes the rows it trains on
    (:meth:`take_refs`, into a :class:`CorpusShare`), the miner the whole table (:meth:`table`)."""

    refs: list[Any]
    rows: tuple[int, ...]
    """Rows of each block, in block order."""
    lengths_ref: Any = None
    """Object ref of ``(num_rows,)`` int32 tokens per position (what plans and padding need
    of every row without its tokens); None where nothing asks for it."""

    @property
    def num_rows(self) -> int:
        return int(sum(self.rows))

    @property
    def starts(self) -> np.ndarray:
        """``(blocks + 1,)`` the first position of each block, then the number of rows."""
        return np.concatenate([[0], np.cumsum(np.asarray(self.rows, dtype=np.int64))])

    def table(self) -> pa.Table:
        """``(id, input_ids, text_key)`` of every row, in position order."""
        import ray  # deferred: the evaluate job imports this module without Ray

        tables = [t.select(["id", "input_ids", "text_key"]) for t in ray.get(self.refs)]
        if not tables:
            return pa.table({"id": pa.array([], pa.int64()), "input_ids": pa.array([], pa.large_list(pa.int32())),
                             "text_key": pa.array([], pa.int64())})  # fmt: skip
        table = pa.concat_tables(tables)
        return table.set_column(1, "input_ids", large_tokens(table.column("input_ids"))).combine_chunks()

    def take_refs(self, positions: np.ndarray, columns: tuple[str, ...] = ("input_ids",)) -> list[Any]:
        """Object refs of tables of ``columns`` of the sorted, distinct ``positions``: one per
        block that holds any of them, in position order.

        Each is a task that takes its rows where the block is (Ray places a task beside its
        largest argument), so only these rows cross the network. The tasks reserve no CPU: the
        train workers that ask hold the CPUs, and a take is a copy of rows, not compute."""
        import ray

        starts = self.starts
        bounds = np.searchsorted(positions, starts)
        take = ray.remote(num_cpus=0)(_take_rows)
        return [
            take.remote(self.refs[k], positions[bounds[k] : bounds[k + 1]] - starts[k], columns)
            for k in np.flatnonzero(np.diff(bounds))
        ]


class TokenizedCorpus:
    """Position-addressed view of the tokenized table, shared by training and mining.

    Holds numpy views of the Arrow buffers (no copy when the table came from the object
    store as ``large_list``) and pads any set of rows into a batch.
    """

    def __init__(self, table: pa.Table, pad_token_id: int):
        tokens = large_tokens(table.column("input_ids"))
        ids = table.column("id").to_numpy() if "id" in table.column_names else None
        self._init(tokens.offsets.to_numpy(), tokens.values.to_numpy(), pad_token_id, ids)

    @classmethod
    def of_arrays(cls, offsets: np.ndarray, values: np.ndarray, pad_token_id: int) -> TokenizedCorpus:
        """The corpus whose row ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (no ids: rows
        are known by position)."""
        corpus = cls.__new__(cls)
        corpus._init(offsets, values, pad_token_id, None)
        return corpus

    def _init(
        self, offsets: np.ndarray, values: np.ndarray, pad_token_id: int, ids: np.ndarray | None
    ) -> None:
        self.offsets, self.values = offsets, values
        self.lengths = np.diff(offsets).astype(np.int32)
        self.pad_token_id = pad_token_id
        self._ids = ids

    @property
    def ids(self) -> np.ndarray:
        """Each row's id (its position where the table had none)."""
        return self._ids if self._ids is not None else np.arange(len(self.lengths))

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_texts(self) -> int:
        """Texts in the corpus (every position this corpus answers for)."""
        return len(self.lengths)

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` of shape ``(len(rows), longest)``, right-padded."""
        lengths = self.lengths[rows]
        width = int(lengths.max())
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.arange(width)[None, :] < lengths[:, None]
        starts = self.offsets[rows]
        input_ids[mask] = self.values[(starts[:, None] + np.arange(width)[None, :])[mask]]
        return input_ids, mask.astype(np.int64)


class CorpusShare:
    """The rows of the tokenized corpus one train worker holds: those its share of the epoch's
    plan names (:meth:`hold`), taken from the blocks, never the whole corpus. Batches are asked
    for by corpus position, as of a :class:`TokenizedCorpus`.

    Args:
        blocks: the corpus' blocks in the object store.
        pad_token_id: the tokenizer's padding id.
        vocab_size: the tokenizer's ids (``len(tokenizer)``): up to 65,536 the tokens are held
            in 2 bytes, not 4 (BERT's 30,522 ids: 150 MB less at 2.5M rows of 30 tokens); None:
            4 bytes.
    """

    def __init__(self, blocks: TokenizedBlocks, pad_token_id: int, vocab_size: int | None = None):
        self.blocks = blocks
        self.pad_token_id = pad_token_id
        self.token_dtype = np.uint16 if vocab_size is not None and vocab_size <= 2**16 else np.int32
        self.num_texts = blocks.num_rows
        """Texts in the whole corpus (positions run from 0 to this)."""
        self.positions = np.empty(0, dtype=np.int64)
        """Sorted corpus positions of the rows held."""
        self._rows: TokenizedCorpus | None = None

    def __len__(self) -> int:
        """Rows held now."""
        return len(self.positions)

    def hold(self, positions: np.ndarray, lengths: np.ndarray) -> None:
        """Hold exactly the rows at the sorted, distinct ``positions``, of ``lengths`` tokens
        each, fetching them unless they are the ones held already.

        The rows go straight into one array, a block's part at a time, so the worker's heap
        holds its share once; the object-store pages of each part it read (Ray maps the store
        into the process, and they would count in its RSS) are dropped once copied."""
        import ray

        wanted = np.asarray(positions, dtype=np.int64)
        if self._rows is not None and np.array_equal(wanted, self.positions):
            return
        self._rows = None  # the old share goes before the new one arrives
        offsets = np.zeros(len(wanted) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.empty(int(offsets[-1]), dtype=self.token_dtype)
        filled = 0
        for ref in self.blocks.take_refs(wanted):
            part = ray.get(ref).column("input_ids")
            for chunk in part.chunks:
                flat = pc.list_flatten(chunk).to_numpy()
                values[filled : filled + len(flat)] = flat
                filled += len(flat)
                del flat
                for buffer in chunk.buffers():
                    if buffer is not None:
                        release_shared_pages(buffer.address, buffer.size)
            del part  # the part's object can leave the store once copied
        if filled != len(values):
            raise RuntimeError(
                f"the corpus' blocks hold {filled} tokens for these rows, their lengths say {len(values)}"
            )
        self._rows = TokenizedCorpus.of_arrays(offsets, values, self.pad_token_id)
        self.positions = wanted

    @property
    def held(self) -> TokenizedCorpus:
        """The rows held, as a corpus of their own: its row ``i`` is corpus position
        ``positions[i]`` (what an encoder reads, in its own order)."""
        if self._rows is None:
            raise RuntimeError("CorpusShare.held before any rows were held")
        return self._rows

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`TokenizedCorpus.batch` of corpus positions, each of which must be held."""
        if self._rows is None:
            raise RuntimeError("CorpusShare.batch before any rows were held")
        local = np.minimum(np.searchsorted(self.positions, rows), len(self.positions) - 1)
        if not np.array_equal(self.positions[local], rows):
            missing = np.setdiff1d(rows, self.positions)
            raise KeyError(f"corpus positions {missing[:5].tolist()} are not in this worker's share")
        return self._rows.batch(local)


def row_lengths(text_lengths: np.ndarray, triplets: Triplets | None = None) -> np.ndarray:
    """Tokens per training row, i.e. the width a row forces on its padded batch: a sentence's
    length, or for a triplet row the longer of its anchor and positive (``text_lengths``:
    tokens per corpus position)."""
    lengths = padded_lengths(text_lengths, triplets)
    return lengths if lengths.ndim == 1 else lengths.max(axis=1)


def padded_lengths(text_lengths: np.ndarray, triplets: Triplets | None = None) -> np.ndarray:
    """Tokens of each training row in each group the train step pads on its own:
    ``(num_rows,)`` for sentences, ``(num_rows, 2)`` for triplet rows (anchor, positive; the
    negatives, padded with the positives, are left out)."""
    if triplets is None:
        return text_lengths
    return np.stack([text_lengths[triplets.anchor], text_lengths[triplets.positive]], axis=1)


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
