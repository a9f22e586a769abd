"""Tokenizing the corpus with a Ray Data actor pool (one tokenizer load per actor); the tokens
stay in the object store."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config.data_section import DataSection
from pipeline.data.normalize import with_text_keys
from pipeline.data.tokenized import TokenizedBlocks

if TYPE_CHECKING:
    from pipeline.data.text_blocks import DistinctTexts

ROWS_PER_BATCH = 1024
"""Rows per tokenization batch. Fixed: large enough that Ray Data's per-batch cost is small
beside the tokenization, small enough that a batch's Python lists of tokens stay small. The work
spreads over the actors by the texts' ranges (:func:`~pipeline.data.text_blocks.range_count`)."""


@dataclass
class TokenizeStats:
    sentences: int
    truncated: int
    """Sentences longer than ``max_seq_len`` tokens (special tokens included), cut to it."""
    max_seq_len: int
    unk_tokens: int = 0
    """``[UNK]`` tokens in the tokenized (truncated) corpus."""
    word_tokens: int = 0
    """Tokens other than special ones (``[CLS]``, ``[SEP]``, ...), ``[UNK]`` included."""
    has_unk: bool = False
    """The tokenizer has an unknown token; without one there is no ``[UNK]`` share."""

    HINT_SHARE = 0.05
    """From this share of truncated sentences on, :meth:`describe` suggests a longer
    ``data.max_seq_len``."""

    def describe(self) -> str:
        return (
            f"{self.sentences} sentences (max_seq_len {self.max_seq_len}; {self.truncated} truncated"
            f"{self.truncation_hint()})"
        )

    def truncation_hint(self) -> str:
        """``": 25.6% of sentences are longer, consider raising data.max_seq_len"`` when at least
        :attr:`HINT_SHARE` of the sentences were cut, else ``""``. Only the share is known:
        the tokenized lengths stop at ``max_seq_len``, so how long the cut sentences were is not."""
        share = self.truncated / self.sentences if self.sentences else 0.0
        if share < self.HINT_SHARE:
            return ""
        return f": {share:.1%} of sentences are longer, consider raising data.max_seq_len"

    def tags(self) -> dict[str, int]:
        return {"data.truncated": self.truncated}

    UNK_WARN_SHARE = 0.01
    """From this share of ``[UNK]`` tokens on, :meth:`unk_warning` warns."""

    @property
    def unk_share(self) -> float | None:
        """``[UNK]`` tokens among the corpus' non-special tokens; None when the tokenizer has
        no unknown token."""
        if not self.has_unk:
            return None
        return self.unk_tokens / self.word_tokens if self.word_tokens else 0.0

    def unk_warning(self) -> str | None:
        """One line when at least :attr:`UNK_WARN_SHARE` of the tokens are ``[UNK]``: the
        model cannot tell those words apart, whatever it is trained on."""
        share = self.unk_share
        if share is None or share < self.UNK_WARN_SHARE:
            return None
        return (
            f"warning: {share:.1%} of the corpus' tokens are [UNK] ({self.unk_tokens} of "
            f"{self.word_tokens}): the tokenizer probably does not cover this language or "
            "script; use a model whose vocabulary does"
        )


def count_unknown(input_ids: Any, tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``input_ids`` (list<int>): ``[UNK]`` tokens and tokens that are not special
    (``[UNK]`` counts as one of those). Zeros when the tokenizer has no unknown token."""
    if isinstance(input_ids, pa.ChunkedArray):
        input_ids = input_ids.combine_chunks()
    rows = len(input_ids)
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is None or rows == 0:
        return np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    flat = pc.list_flatten(input_ids).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(input_ids).to_numpy(zero_copy_only=False)
    special = np.array(sorted(set(tokenizer.all_special_ids) - {unk_id}), dtype=flat.dtype)
    unk = np.bincount(parents, weights=flat == unk_id, minlength=rows)
    words = np.bincount(parents, weights=~np.isin(flat, special), minlength=rows)
    return unk.astype(np.int32), words.astype(np.int32)


def _encode(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    return tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]


def tokenize_table(
    batch: pa.Table, tokenizer: Any, max_seq_len: int, *, flag_truncated: bool = False
) -> pa.Table:
    """Append ``input_ids`` (list<int32>, special tokens included, truncated) to a ``text`` table.

    With ``flag_truncated`` also a bool column ``truncated``: the sentence had more than
    ``max_seq_len`` tokens. Encoding to ``max_seq_len + 1`` tells exactly that (a row reaches
    it only if longer than ``max_seq_len``) for any tokenizer and special-token template;
    only those rows are encoded again at ``max_seq_len``.
    """
    texts = batch.column("text").to_pylist()
    if not flag_truncated:
        encoded = _encode(tokenizer, texts, max_seq_len)
        return batch.append_column("input_ids", pa.array(encoded, type=pa.list_(pa.int32())))
    encoded = _encode(tokenizer, texts, max_seq_len + 1)
    truncated = [len(ids) > max_seq_len for ids in encoded]
    long_rows = [i for i, cut in enumerate(truncated) if cut]
    if long_rows:
        again = _encode(tokenizer, [texts[i] for i in long_rows], max_seq_len)
        for i, ids in zip(long_rows, again, strict=True):
            encoded[i] = ids
    table = batch.append_column("input_ids", pa.array(encoded, type=pa.list_(pa.int32())))
    return table.append_column("truncated", pa.array(truncated, pa.bool_()))


class _TokenizeBatches:
    """Ray Data actor: loads the tokenizer once, then tokenizes batch after batch.

    Plain tasks would each start a worker that imports transformers and unpickles the
    tokenizer, which costs far more than the tokenization of a batch.
    """

    def __init__(self, tokenizer: Any, max_seq_len: int):
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len

    def __call__(self, batch: pa.Table) -> pa.Table:
        table = tokenize_table(batch, self.tokenizer, self.max_seq_len, flag_truncated=True)
        unk, words = count_unknown(table.column("input_ids"), self.tokenizer)
        # The text stays behind: what the workers and the miner need of it is its tokens and,
        # for the negative filters, which texts are the same sentence (text_key).
        return (
            with_text_keys(table)
            .drop_columns(["text"])
            .append_column("unk_tokens", pa.array(unk))
            .append_column("word_tokens", pa.array(words))
            .append_column("length", pc.list_value_length(table.column("input_ids")).cast(pa.int32()))
        )


def tokenize_texts(
    texts: DistinctTexts, tokenizer: Any, section: DataSection
) -> tuple[TokenizedBlocks, TokenizeStats]:
    """Tokenize the distinct texts with Ray Data ``map_batches`` over a pool of tokenizer
    actors; the tokens stay in the object store.

    The texts' blocks are ranges of positions sorted by id
    (:func:`~pipeline.data.text_blocks.distinct_texts`) and Ray Data keeps their order, so the
    tokenized blocks are too: a worker finds any row from the blocks' sizes
    (:meth:`TokenizedBlocks.take_refs`). The tokens per position are put beside them
    (``lengths_ref``).

    Returns:
        The ``(id, input_ids, text_key)`` blocks (:class:`~pipeline.data.tokenized.TokenizedBlocks`;
        each train worker takes its rows, the miner the whole table), how many texts were cut
        to ``data.max_seq_len``, and the corpus' ``[UNK]`` share.
    """

    # Deferred: model/encode.py imports this module for tokenize_table, and the evaluate job
    # and bench/gpu_step.py run that without Ray.
    import ray
    import ray.data

    from pipeline.data.text_blocks import block_columns, column_totals, materialized_blocks, tokenizer_slots

    batches = -(-len(texts) // ROWS_PER_BATCH)
    # The pool grows from one actor to what the cluster's CPUs hold at data.tokenize_num_cpus
    # each, and never past one actor per batch (each actor loads the tokenizer once).
    max_actors = max(1, min(tokenizer_slots(section.tokenize_num_cpus), batches))
    with warnings.catch_warnings():
        # Ray (2.60) takes max_restarts only through map_batches' **ray_remote_args, which it
        # marks deprecated (removal planned for 2.64) without a named replacement yet.
        warnings.filterwarnings(
            "ignore", message="`ray_remote_args` is deprecated", category=DeprecationWarning
        )
        ds = ray.data.from_arrow_refs(texts.blocks).map_batches(
            _TokenizeBatches,
            batch_format="pyarrow",
            batch_size=ROWS_PER_BATCH,
            num_cpus=section.tokenize_num_cpus,
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max_actors),
            fn_constructor_kwargs={"tokenizer": tokenizer, "max_seq_len": section.max_seq_len},
            # Ray Data restarts pool actors without limit by default. Tokenizing is a short
            # stage at job start, before any training, so a dead tokenizer actor fails the job
            # at once with its error instead. A restart would also depend on the tokenizer
            # argument still being in the object store (what Ray warns about for
            # max_restarts > 0).
            max_restarts=0,
        )
    blocks = materialized_blocks(ds)
    lengths, rows = block_columns(blocks, ["length"], section.tokenize_num_cpus)
    totals = column_totals(blocks, ["truncated", "unk_tokens", "word_tokens"], section.tokenize_num_cpus)
    stats = TokenizeStats(
        sentences=lengths.num_rows,
        truncated=totals["truncated"],
        max_seq_len=section.max_seq_len,
        unk_tokens=totals["unk_tokens"],
        word_tokens=totals["word_tokens"],
        has_unk=getattr(tokenizer, "unk_token_id", None) is not None,
    )
    return TokenizedBlocks(blocks, tuple(rows.tolist()), ray.put(lengths.column("length").to_numpy())), stats
