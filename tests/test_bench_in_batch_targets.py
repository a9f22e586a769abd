"""``bench.in_batch_targets``: the in-batch distributions and their summary, against torch's own
softmax and KL divergence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.in_batch_targets import batch_distributions, read_pairs, summary


def test_batch_distributions_leave_false_negatives_out_and_match_torch_softmax():
    rng = np.random.default_rng(0)
    anchors, positives = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    same = np.eye(5, dtype=bool)
    same[0, 3] = same[3, 0] = True  # rows 0 and 3 share a positive's text, or an anchor
    probs = batch_distributions(anchors, positives, same, temperature=0.1)
    logits = torch.tensor(anchors @ positives.T / 0.1)
    for row in range(5):
        kept = [c for c in range(5) if c == row or not same[row, c]]
        expected = np.zeros(5)
        expected[kept] = torch.softmax(logits[row, kept], dim=0).numpy()
        assert probs[row] == pytest.approx(expected, abs=1e-12)
    assert probs[0, 3] == 0.0 and probs[3, 0] == 0.0 and probs[1, 3] > 0.0


def test_summary_reads_the_own_column_of_each_batch_and_torchs_kl():
    rng = np.random.default_rng(1)
    b = 4
    # Two batches of 4 rows, stacked as the bench stacks them: row i's own column is i mod 4.
    teacher = rng.dirichlet(np.ones(b), size=2 * b)
    student = rng.dirichlet(np.ones(b), size=2 * b)
    got = summary(student, teacher)
    own = student[np.arange(2 * b), np.arange(2 * b) % b]
    kl = torch.nn.functional.kl_div(
        torch.tensor(np.log(student)), torch.tensor(teacher), reduction="none"
    ).sum(dim=1)
    assert got["p(positive)"] == pytest.approx(own.mean())
    assert got["rows above 0.95"] == pytest.approx((own > 0.95).mean())
    assert got["KL(teacher || it)"] == pytest.approx(kl.mean().item())
    assert summary(teacher, teacher)["KL(teacher || it)"] == pytest.approx(0.0, abs=1e-12)
    # The rest spread evenly over the b - 1 others is entropy 1; all on one of them, 0.
    even = np.full((b, b), 0.1 / (b - 1))
    even[np.arange(b), np.arange(b)] = 0.9
    peaked = np.zeros((b, b))
    peaked[np.arange(b), np.arange(b)] = 0.9
    peaked[np.arange(b), (np.arange(b) + 1) % b] = 0.1
    assert summary(even, even)["rest's entropy (0-1)"] == pytest.approx(1.0)
    assert summary(peaked, peaked)["rest's entropy (0-1)"] == pytest.approx(0.0)


def test_read_pairs_keeps_the_label_one_rows(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text('a headline\ta tweet\t1\na headline\tanother "quoted" tweet\t0\nb\tc\t1\n')
    assert read_pairs(path) == (["a headline", "b"], ["a tweet", "c"])
    path.write_text("a headline\ta tweet\t1\nshort row\n")
    with pytest.raises(ValueError, match="train.tsv:2: 1 tab-separated columns"):
        read_pairs(path)
