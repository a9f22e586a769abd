"""Each train worker holds its share of the tokenized corpus, not the corpus: the blocks come
out of tokenizing sorted by id into ranges of positions, a worker takes the rows its share of
the plan names (one task per block), and pads batches from them as from the whole corpus."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.batching.samplers import random_plan
from pipeline.data.tokenized import CorpusShare, TokenizedCorpus, large_tokens
from pipeline.data.triplets import Triplets
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.plan_source import PlanSource, make_shares


def test_blocks_are_ranges_of_positions_in_id_order(sorted_blocks):
    import ray

    blocks, corpus, tokenizer = sorted_blocks
    assert len(blocks.refs) > 2 and blocks.num_rows == corpus.num_rows
    ids = np.concatenate([t.column("id").to_numpy() for t in ray.get(blocks.refs)])
    # Position i is the i-th smallest id, block after block, without any sort on the reader.
    assert np.array_equal(ids, corpus.column("id").to_numpy())
    assert [t.num_rows for t in ray.get(blocks.refs)] == list(blocks.rows)
    expected = tokenizer(corpus.column("text").to_pylist(), truncation=True, max_length=16)["input_ids"]
    assert ray.get(blocks.lengths_ref).tolist() == [len(t) for t in expected]


def test_take_gives_the_rows_of_any_positions_across_blocks(sorted_blocks):
    import ray

    blocks, _, _ = sorted_blocks
    whole = blocks.table()
    rng = np.random.default_rng(0)
    positions = np.unique(rng.integers(0, blocks.num_rows, size=150))
    taken = pa.concat_tables(ray.get(blocks.take_refs(positions)))
    assert (
        taken.column("input_ids").to_pylist()
        == whole.column("input_ids").take(pa.array(positions)).to_pylist()
    )
    assert blocks.take_refs(np.empty(0, dtype=np.int64)) == []


@pytest.mark.parametrize("vocab_size", [None, "tokenizer"])
def test_a_share_pads_batches_as_the_whole_corpus_does_and_holds_only_its_rows(
    sorted_blocks, tiny_model_dir, vocab_size
):
    """``vocab_size``: the tokenizer's (its ids held in 2 bytes) or none given (4 bytes)."""
    import ray

    blocks, _, tokenizer = sorted_blocks
    whole = TokenizedCorpus(blocks.table(), tokenizer.pad_token_id)
    plan = random_plan(blocks.num_rows, 16, seed=4)
    held = []
    for rank in range(3):
        share = CorpusShare(blocks, tokenizer.pad_token_id, len(tokenizer) if vocab_size else None)
        part = plan.share(world=3, rank=rank)
        share.hold(np.unique(part.rows), ray.get(blocks.lengths_ref)[np.unique(part.rows)])
        assert share.held.values.dtype == (np.uint16 if vocab_size else np.int32)
        held.append(share.positions)
        batch = GlobalBatch.of_plan(plan, 5, world=3, rank=rank)
        for got, want in zip(share.batch(batch.local_rows), whole.batch(batch.local_rows), strict=True):
            assert np.array_equal(got, want)
        other = np.setdiff1d(plan.batch(5), batch.local_rows)[:1]
        with pytest.raises(KeyError, match="not in this worker's share"):
            share.batch(other)
    # Three shares: each row held by exactly one rank.
    assert np.array_equal(np.sort(np.concatenate(held)), np.arange(blocks.num_rows))
    assert max(len(h) for h in held) <= -(-blocks.num_rows // 3) + plan.num_batches


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_a_plan_share_is_the_ranks_slice_of_every_batch(world):
    plan = random_plan(203, 16, seed=1)  # balanced sizes 15 and 16: uneven slices
    negatives = np.arange(203 * 2).reshape(203, 2)
    # Every rank's share cut from one making of the plan (the boundary's one task) is each one's own.
    for rank, share in enumerate(plan.shares(world=world, negatives=negatives)):
        assert np.array_equal(share.rows, plan.share(world=world, rank=rank, negatives=negatives).rows)
        for b in range(plan.num_batches):
            expected = GlobalBatch.of_plan(plan, b, world=world, rank=rank, negatives=negatives)
            rows, mined = share.local(b)
            assert np.array_equal(rows, expected.local_rows) and np.array_equal(mined, expected.local_mined)
        assert share.fingerprint == plan.hex_fingerprint(negatives) and share.num_batches == plan.num_batches


def test_a_triplet_share_names_its_rows_texts_and_negatives(tmp_path):
    from pipeline.config.loading import load_config
    from pipeline.training.plan_source import write_mined

    cfg = load_config(None, ["task=pairs", "data.path=rows.jsonl", "train.batch_size=4"])
    triplets = Triplets(np.array([10, 11, 12, 13]), np.array([20, 21, 22, 23]), np.array([-1, 30, -1, -1]))
    mined = np.array([[40, -1], [41, 42], [-1, -1], [43, 44]])
    source = PlanSource(1, seed=3, negatives=write_mined(str(tmp_path), "v1-negatives.npz", negatives=mined))
    lengths = np.arange(50, dtype=np.int32) + 2
    texts = []

    def texts_of(row: int) -> set[int]:
        named = (triplets.anchor[row], triplets.positive[row], triplets.negative[row], *mined[row])
        return {int(t) for t in named if t >= 0}

    for rank, share in enumerate(make_shares(source, cfg, lengths, triplets, world=2)):
        assert share.rank == rank and share.world == 2
        assert set(share.texts.tolist()) == set().union(*(texts_of(row) for row in share.rows.tolist()))
        assert np.array_equal(share.text_lengths, lengths[share.texts])
        assert np.array_equal(share.negatives, mined[share.rows])
        texts.append(share.texts)
    # Between them the ranks hold every row's texts once.
    assert sorted(np.concatenate(texts).tolist()) == sorted(
        {*range(10, 14), *range(20, 24), 30, 40, 41, 42, 43, 44}
    )


def test_token_offsets_are_64_bit():
    """``list<int32>``'s 32-bit offsets overflow past 2^31 tokens (67M rows of 32); the corpus
    is read as ``large_list`` whatever its blocks hold, each chunk cast before joining."""
    chunks = pa.chunked_array(
        [pa.array([[1, 2], [3]], pa.list_(pa.int32())), pa.array([[4, 5, 6]], pa.list_(pa.int32()))]
    )
    tokens = large_tokens(chunks)
    assert tokens.type == pa.large_list(pa.int32()) and tokens.to_pylist() == [[1, 2], [3], [4, 5, 6]]
    corpus = TokenizedCorpus(pa.table({"input_ids": chunks}), pad_token_id=0)
    assert corpus.offsets.dtype == np.int64 and corpus.lengths.tolist() == [2, 1, 3]


def test_a_share_fetches_again_only_when_its_rows_change(sorted_blocks, monkeypatch):
    import ray

    blocks, _, tokenizer = sorted_blocks
    share = CorpusShare(blocks, tokenizer.pad_token_id)
    lengths = ray.get(blocks.lengths_ref)
    asked = []
    take_refs = blocks.take_refs
    monkeypatch.setattr(
        type(blocks),
        "take_refs",
        lambda self, positions: asked.append(len(positions)) or take_refs(positions),
    )
    share.hold(np.array([3, 9, 40]), lengths[[3, 9, 40]])
    share.hold(np.array([3, 9, 40]), lengths[[3, 9, 40]])  # the same rows: nothing fetched
    assert asked == [3] and share.positions.tolist() == [3, 9, 40]
    share.hold(np.array([1, 2]), lengths[[1, 2]])  # an epoch's new rows replace the old ones
    assert asked == [3, 2] and len(share) == 2
    with pytest.raises(KeyError):
        share.batch(np.array([9]))


def test_blocks_kept_in_run_storage_read_back_as_they_were(sorted_blocks, tmp_path):
    """A multi-node job's spare copy of the tokenized corpus: each block written once to run
    storage and read back by a task (which Ray re-runs from its lineage where every copy of the
    block was lost with its nodes): the same rows, columns and types, in the same blocks."""
    import dataclasses

    import ray

    from pipeline.runtime.nodes import rebuildable_from_storage

    blocks, _, _ = sorted_blocks
    stored = rebuildable_from_storage(blocks.refs, str(tmp_path / "tokenized"))
    assert len(list((tmp_path / "tokenized").glob("block-*.parquet"))) == len(blocks.refs) > 1
    for original, read_back in zip(ray.get(blocks.refs), ray.get(stored), strict=True):
        assert read_back.equals(original)  # types too: large_list tokens stay large_list
    assert dataclasses.replace(blocks, refs=stored).table().equals(blocks.table())
