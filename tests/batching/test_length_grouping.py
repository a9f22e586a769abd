"""Length-grouped random batches (``train.group_by_length``): the same rows and batch sizes
as a random plan, far less padding, the widest batch first."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.batching.samplers import random_plan
from pipeline.config.loading import load_config
from pipeline.config.train_section import LENGTH_GROUP_BATCHES


def _padding_share(plan, lengths: np.ndarray) -> float:
    """Pad tokens over all tokens when every batch is padded to its longest row."""
    padded = sum(len(b) * int(lengths[b].max()) for b in plan.batches())
    return 1 - lengths.sum() / padded


def test_padding_share_counts_each_workers_slice():
    from pipeline.batching.plan import BatchPlan, padding_share

    lengths = np.array([2, 8, 4, 4, 6, 1])
    plan = BatchPlan(0, np.arange(6), np.array([4, 2]))  # batches [2 8 4 4], [6 1]
    assert padding_share(plan, lengths) == pytest.approx(1 - 25 / (4 * 8 + 2 * 6))
    # Two workers: [2 8] [4 4] and [6] [1].
    assert padding_share(plan, lengths, world_size=2) == pytest.approx(1 - 25 / (2 * 8 + 2 * 4 + 6 + 1))
    assert padding_share(random_plan(6400, 64, seed=1), _lengths(6400)) == pytest.approx(
        _padding_share(random_plan(6400, 64, seed=1), _lengths(6400))
    )
    # Rows of two texts padded apart (the pairs step's anchors and positives): each column to
    # its own longest. Anchors [1 1 3 1] pad to 3, positives [5 9 5 5] to 9; then [2 1], [7 8].
    pairs = np.array([[1, 5], [1, 9], [3, 5], [1, 5], [2, 7], [1, 8]])
    real = pairs.sum()
    assert padding_share(plan, pairs) == pytest.approx(1 - real / (4 * 3 + 4 * 9 + 2 * 2 + 2 * 8))


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    # Sentence lengths of a natural corpus: long-tailed, 5 to 128 tokens.
    return np.clip(np.random.default_rng(seed).lognormal(3.0, 0.5, size=n), 5, 128).astype(np.int64)


def test_grouped_plan_covers_the_same_rows_in_the_same_batch_sizes():
    lengths = _lengths(5000)
    grouped = random_plan(5000, 64, seed=1, lengths=lengths, group_batches=20)
    plain = random_plan(5000, 64, seed=1)
    assert sorted(grouped.rows.tolist()) == list(range(5000))
    assert sorted(grouped.sizes.tolist()) == sorted(plain.sizes.tolist())
    assert [len(b) for b in grouped.batches()] == grouped.sizes.tolist()
    again = random_plan(5000, 64, seed=1, lengths=lengths, group_batches=20)
    assert again.fingerprint() == grouped.fingerprint()
    assert (
        random_plan(5000, 64, seed=2, lengths=lengths, group_batches=20).fingerprint()
        != grouped.fingerprint()
    )


def test_grouping_removes_most_padding_and_puts_the_widest_batch_first():
    lengths = _lengths(5000)
    plain = random_plan(5000, 64, seed=1)
    grouped = random_plan(5000, 64, seed=1, lengths=lengths, group_batches=50)
    assert _padding_share(plain, lengths) > 0.4
    assert _padding_share(grouped, lengths) < 0.1
    assert lengths[grouped.batch(0)].max() == lengths.max()
    # Batches are still mixed across the corpus: the order is not sorted by length.
    widths = [int(lengths[b].max()) for b in grouped.batches()]
    assert widths != sorted(widths, reverse=True) and widths != sorted(widths)


def test_smaller_groups_keep_more_variety_inside_a_batch():
    """Rows of one group of G batches come from G x batch_size random rows: a group of 2
    batches cannot sort the corpus, a group of 50 nearly can."""
    lengths = _lengths(6400)
    share = {
        g: _padding_share(random_plan(6400, 64, seed=4, lengths=lengths, group_batches=g), lengths)
        for g in (2, 50)
    }
    assert share[50] < share[2] < _padding_share(random_plan(6400, 64, seed=4), lengths)


def test_without_lengths_or_groups_the_plan_is_the_random_one():
    lengths = _lengths(1000)
    plain = random_plan(1000, 64, seed=3)
    assert (
        random_plan(1000, 64, seed=3, lengths=lengths, group_batches=0).fingerprint() == plain.fingerprint()
    )
    assert random_plan(1000, 64, seed=3, lengths=None, group_batches=50).fingerprint() == plain.fingerprint()
    with pytest.raises(ValueError, match="lengths has shape"):
        random_plan(1000, 64, seed=3, lengths=lengths[:10], group_batches=50)


PAIRS = ["task=pairs", "data.path=pairs.tsv", "train.batch_size=16"]


@pytest.mark.parametrize(
    ("overrides", "given_negatives", "grouped"),
    [
        ([], False, False),  # the corpus task: ungrouped unless asked
        (["train.group_by_length=true"], False, True),
        ([*PAIRS, "mining.refresh=never"], False, True),  # in-batch negatives only: grouped
        ([*PAIRS, "mining.refresh=never"], True, False),  # rows carry given negatives
        (PAIRS, False, False),  # mined once before epoch 1 (the pairs default)
        ([*PAIRS, "mining.refresh=every_epoch"], False, False),
        ([*PAIRS, "mining.refresh=never", "train.group_by_length=false"], False, False),
        ([*PAIRS, "train.group_by_length=true"], True, True),
    ],
)
def test_group_by_length_unset_groups_exactly_the_rows_without_hard_negatives(
    overrides, given_negatives, grouped
):
    """Unset, ``train.group_by_length`` groups the pairs task's batches when its rows carry no
    hard negative (measured better and faster there, worse with mined negatives:
    docs/results.md); set, it is what it says. The plan is the one ``random_plan`` gives with
    or without :data:`LENGTH_GROUP_BATCHES`."""
    from pipeline.training.plan_source import random_batches

    cfg = load_config(overrides=overrides)
    assert cfg.groups_by_length(given_negatives=given_negatives) is grouped
    lengths = np.random.default_rng(0).integers(3, 33, size=400)
    plan = random_batches(cfg, 7, lengths, given_negatives=given_negatives)
    expected = random_plan(
        400,
        cfg.train.batch_size,
        seed=7,
        lengths=lengths,
        group_batches=LENGTH_GROUP_BATCHES if grouped else 0,
    )
    assert plan.fingerprint() == expected.fingerprint()
    assert LENGTH_GROUP_BATCHES == 50  # Hugging Face's megabatch


def test_given_negatives_are_read_from_the_rows():
    from pipeline.data.triplets import index_triplets

    _, without = index_triplets(["a", "b"], ["c", "d"], None)
    _, some = index_triplets(["a", "b"], ["c", "d"], ["", "e"])
    assert not without.has_given_negatives
    assert some.has_given_negatives and (some.negative >= 0).sum() == 1


def test_pairs_batches_group_by_length(trained_tiny_model_dir, paraphrase_pairs):
    """The pairs task's batches are random over its rows (every epoch, refreshed or not); grouped,
    they are narrower than ungrouped ones over the same rows (width = longer of anchor and
    positive)."""
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.tokenized import TokenizedCorpus, row_lengths
    from pipeline.data.triplets import index_triplets
    from pipeline.model.folders import load_tokenizer
    from pipeline.training.plan_source import random_batches

    anchors, positives = paraphrase_pairs
    table, triplets = index_triplets(anchors, positives, None)
    tokenizer = load_tokenizer(trained_tiny_model_dir)
    tokenized = tokenize_table(table, tokenizer, 32)
    lengths = row_lengths(TokenizedCorpus(tokenized, tokenizer.pad_token_id).lengths, triplets)
    plain = random_batches(load_config(overrides=["train.batch_size=16"]), 1, lengths)
    grouped_cfg = load_config(overrides=["train.batch_size=16", "train.group_by_length=true"])
    grouped = random_batches(grouped_cfg, 1, lengths)
    # Independent widths: the tokenizer's own lengths, not the corpus' offsets.
    text = table.column("text").to_pylist()
    token_count = np.array([len(tokenizer(t, truncation=True, max_length=32)["input_ids"]) for t in text])
    widths = np.maximum(token_count[triplets.anchor], token_count[triplets.positive])
    assert np.array_equal(lengths, widths)
    assert _padding_share(grouped, widths) < 0.5 * _padding_share(plain, widths)
    assert sorted(grouped.rows.tolist()) == list(range(len(triplets)))
