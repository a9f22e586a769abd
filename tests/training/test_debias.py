"""In-batch false-negative debiasing (pipeline/training/debias.py and simcse_loss's mask).

The mask must flag exactly the pairs a plain double loop over the plan's hints finds, and
the loss must then drop (weight 0) or down-weight (weight w) exactly those candidates: its
value matches an independent softmax over the remaining candidates, and a removed candidate
neither moves the loss nor receives a gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.batching.plan import BatchPlan, balanced_batch_sizes
from pipeline.mining.plan_quality import debias_counts
from pipeline.training.debias import false_negative_mask, flagged_pairs_in_batches
from pipeline.training.losses import simcse_loss

NUM_ROWS = 120
BATCH = 16


def _plan(seed: int = 0, num_rows: int = NUM_ROWS, batch: int = BATCH, width: int = 6) -> BatchPlan:
    """A random plan with both hints: each row's paraphrase list holds -1 gaps, rows of other
    batches and sometimes the row itself; a few rows are in no cluster (-1)."""
    rng = np.random.default_rng(seed)
    paraphrases = rng.integers(0, num_rows, size=(num_rows, width))
    paraphrases[rng.random((num_rows, width)) < 0.4] = -1
    paraphrases[:5, 0] = np.arange(5)  # a row listed as its own paraphrase: never flagged
    clusters = rng.integers(0, 10, size=num_rows)
    clusters[rng.random(num_rows) < 0.1] = -1
    return BatchPlan(
        version=1,
        rows=rng.permutation(num_rows).astype(np.int64),
        sizes=balanced_batch_sizes(num_rows, batch),
        paraphrases=paraphrases,
        clusters=clusters,
    )


def _brute_force_mask(rows: np.ndarray, plan: BatchPlan, rule: str) -> np.ndarray:
    """The rule, pair by pair, in plain Python."""
    b = len(rows)
    mask = np.zeros((b, b), dtype=bool)
    for i in range(b):
        for j in range(b):
            if i == j:
                continue
            if rule == "threshold":
                listed_i = [int(x) for x in plan.paraphrases[rows[i]] if x >= 0]
                listed_j = [int(x) for x in plan.paraphrases[rows[j]] if x >= 0]
                mask[i, j] = int(rows[j]) in listed_i or int(rows[i]) in listed_j
            else:
                ci, cj = int(plan.clusters[rows[i]]), int(plan.clusters[rows[j]])
                mask[i, j] = ci >= 0 and ci == cj
    return mask


@pytest.mark.parametrize("rule", ["threshold", "cluster"])
def test_mask_matches_a_double_loop_on_every_batch(rule):
    plan = _plan()
    flagged = 0
    for rows in plan.batches():
        got = false_negative_mask(rows, plan, rule)
        assert got is not None and got.dtype == bool and got.shape == (len(rows), len(rows))
        np.testing.assert_array_equal(got, _brute_force_mask(rows, plan, rule))
        flagged += int(got.sum())
    assert flagged > 0  # the random hints did flag pairs: the comparison is not vacuous


@pytest.mark.parametrize("rule", ["threshold", "cluster"])
def test_mask_with_a_repeated_row(rule):
    """A plan's batch holds each row once, but the mask stays right if one repeats."""
    plan = _plan(seed=1)
    plan.paraphrases[7] = [3, -1, 9, -1, -1, -1]
    rows = np.array([3, 7, 3, 9, 50, 7])
    got = false_negative_mask(rows, plan, rule)
    np.testing.assert_array_equal(got, _brute_force_mask(rows, plan, rule))
    if rule == "threshold":
        assert got[1, 0] and got[1, 2] and got[0, 1] and got[1, 3] and got[3, 5]


def test_no_mask_without_a_rule_or_hints():
    plan = _plan()
    rows = plan.batch(0)
    assert false_negative_mask(rows, plan, "none") is None
    random_plan = BatchPlan(0, plan.rows, plan.sizes)  # epoch 1: no hints at all
    assert false_negative_mask(rows, random_plan, "threshold") is None
    assert false_negative_mask(rows, random_plan, "cluster") is None
    # A hint for the other rule only is no hint for this one.
    only_clusters = BatchPlan(1, plan.rows, plan.sizes, clusters=plan.clusters)
    assert false_negative_mask(rows, only_clusters, "threshold") is None
    assert false_negative_mask(rows, only_clusters, "cluster") is not None
    assert flagged_pairs_in_batches(random_plan, "threshold") == 0
    assert debias_counts(plan, "none") == {}
    with pytest.raises(ValueError, match="mining.debias"):
        false_negative_mask(rows, plan, "paraphrase")


@pytest.mark.parametrize("rule", ["threshold", "cluster"])
def test_flagged_pair_count_matches_brute_force(rule):
    plan = _plan(seed=2)
    want = 0
    for rows in plan.batches():
        brute = _brute_force_mask(rows, plan, rule)
        want += sum(bool(brute[i, j]) for i in range(len(rows)) for j in range(i + 1, len(rows)))
    assert want > 0
    assert flagged_pairs_in_batches(plan, rule) == want
    assert debias_counts(plan, rule)["mining/debias_pairs_in_batches"] == want


def test_mask_at_a_large_batch_is_symmetric_without_diagonal():
    """b=1024 rows with m=64 hints each (the size a GPU step builds every step, on every rank)."""
    plan = _plan(seed=3, num_rows=8192, batch=1024, width=64)
    rows = plan.batch(0)
    for rule in ("threshold", "cluster"):
        mask = false_negative_mask(rows, plan, rule)
        assert mask.shape == (1024, 1024) and mask.any()
        assert np.array_equal(mask, mask.T) and not mask.diagonal().any()


def _inputs(seed: int, n: int = 8, d: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Anchors, positives and a random flag mask (diagonal included: it must be ignored)."""
    rng = np.random.default_rng(seed)
    flagged = rng.random((n, n)) < 0.35
    flagged[0, 1:] = True  # row 0 keeps its positive only: no NaN from an all-removed row
    return (
        torch.tensor(rng.normal(size=(n, d))),
        torch.tensor(rng.normal(size=(n, d))),
        torch.tensor(flagged),
    )


def test_weight_zero_removes_the_flagged_candidates():
    anchors, positives, flagged = _inputs(0)
    t = 0.1
    got = simcse_loss(anchors, positives, t, false_negative_mask=flagged, false_negative_weight=0.0)

    # Independent: per row, a log-softmax over the kept columns only (its positive and the
    # unflagged candidates), in float64.
    a, p = F.normalize(anchors, dim=-1), F.normalize(positives, dim=-1)
    terms = []
    for i in range(len(a)):
        kept = [j for j in range(len(a)) if j == i or not flagged[i, j]]
        logits = torch.stack([a[i] @ p[j] / t for j in kept])
        terms.append(-torch.log_softmax(logits, dim=0)[kept.index(i)])
    assert got.item() == pytest.approx(
        torch.stack(terms).mean().item(), rel=1e-6
    )  # the loss computes in float32
    assert got.item() != pytest.approx(simcse_loss(anchors, positives, t).item(), rel=1e-3)


@pytest.mark.parametrize("weight", [0.05, 0.5, 0.9])
def test_weight_scales_the_flagged_candidates(weight):
    anchors, positives, flagged = _inputs(1)
    t = 0.2
    got = simcse_loss(anchors, positives, t, false_negative_mask=flagged, false_negative_weight=weight)

    # Independent: exp(logit) of each flagged candidate counts `weight` times.
    a = anchors.numpy() / np.linalg.norm(anchors.numpy(), axis=1, keepdims=True)
    p = positives.numpy() / np.linalg.norm(positives.numpy(), axis=1, keepdims=True)
    logits = a @ p.T / t
    scale = np.where(flagged.numpy() & ~np.eye(len(a), dtype=bool), weight, 1.0)
    want = -np.mean(np.diag(logits) - np.log((scale * np.exp(logits)).sum(axis=1)))
    assert got.item() == pytest.approx(want, rel=1e-6)  # the loss computes in float32
    # Between removal (w = 0) and no debiasing (w = 1), which is the unmasked loss.
    unmasked = simcse_loss(anchors, positives, t).item()
    removed = simcse_loss(anchors, positives, t, false_negative_mask=flagged).item()
    assert removed < got.item() < unmasked
    same = simcse_loss(anchors, positives, t, false_negative_mask=flagged, false_negative_weight=1.0)
    assert same.item() == pytest.approx(unmasked, rel=1e-12)


def test_a_removed_candidate_neither_moves_the_loss_nor_gets_a_gradient():
    """Candidate p_j flagged for every other row. p_j is also row j's own positive; with
    anchor j at zero, row j's term is log(#candidates) whatever p_j is, so p_j reaches the
    loss only as the others' candidate: exactly what the mask removes."""
    anchors, positives, _ = _inputs(2)
    n, j, t = len(anchors), 3, 0.05
    anchors[j] = 0.0
    flagged = torch.zeros((n, n), dtype=torch.bool)
    flagged[:, j] = True  # (j, j) too: the diagonal is ignored

    def loss_and_grad(p: torch.Tensor, mask: torch.Tensor | None, weight: float = 0.0):
        p = p.clone().requires_grad_(True)
        loss = simcse_loss(anchors, p, t, false_negative_mask=mask, false_negative_weight=weight)
        loss.backward()
        assert torch.isfinite(p.grad).all()
        return loss.item(), p.grad

    moved = positives.clone()
    moved[j] = torch.tensor([40.0, -3.0, 0.5, 7.0, -11.0])  # anywhere, e.g. onto an anchor
    moved_onto = positives.clone()
    moved_onto[j] = anchors[0] * 2
    base, grad = loss_and_grad(positives, flagged)
    assert torch.count_nonzero(grad[j]) == 0
    for elsewhere in (moved, moved_onto):
        loss, grad = loss_and_grad(elsewhere, flagged)
        assert loss == pytest.approx(base, rel=1e-12)
        assert torch.count_nonzero(grad[j]) == 0
    # The other candidates still get gradient; and without removal, p_j gets one and moves
    # the loss (the check above is not vacuous).
    assert torch.count_nonzero(grad[np.arange(n) != j]) > 0
    for mask, weight in ((None, 0.0), (flagged, 0.5)):
        loss, grad = loss_and_grad(positives, mask, weight)
        assert torch.count_nonzero(grad[j]) > 0
        assert loss_and_grad(moved, mask, weight)[0] != pytest.approx(loss, rel=1e-6)


def test_mask_inputs_are_checked():
    anchors, positives, flagged = _inputs(3)
    with pytest.raises(ValueError, match="false_negative_weight"):
        simcse_loss(anchors, positives, false_negative_mask=flagged, false_negative_weight=-0.1)
    with pytest.raises(ValueError, match="false_negative_weight"):
        simcse_loss(anchors, positives, false_negative_mask=flagged, false_negative_weight=1.5)
    with pytest.raises(ValueError, match="false_negative_mask"):
        simcse_loss(anchors, positives, false_negative_mask=flagged[:-1])


@pytest.mark.parametrize("rule", ["none", "threshold", "cluster"])
def test_the_worker_gives_each_step_its_batch_mask(rule):
    """SimCSEWorker.train_batch builds the global batch's mask from the plan and the config
    (here as rank 1 of 2: the mask covers the whole global batch, not the rank's slice)."""
    from pipeline.config.loading import load_config
    from pipeline.training.state import TrainState
    from pipeline.training.worker import SimCSEWorker

    seen = []
    weight = torch.nn.Parameter(torch.ones(2))

    def record(model, batch, augment_rng):
        seen.append(batch)
        loss = weight.sum()
        return loss, loss

    cfg = load_config(None, [f"mining.debias={rule}"])
    plan = _plan(seed=4)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    worker = SimCSEWorker(
        cfg, 1, 2, torch.nn.Linear(2, 2), None, record, optimizer, scheduler,
        TrainState(plan=plan), np.full(NUM_ROWS, 8), None, None, None, None,
    )  # fmt: skip
    worker.train_batch(2)
    (batch,) = seen
    np.testing.assert_array_equal(batch.rows, plan.batch(2))
    assert list(batch.sizes) == [8, 7] and batch.rank == 1  # 15 rows: uneven slices
    if rule == "none":
        assert batch.false_negative_mask is None
    else:
        np.testing.assert_array_equal(batch.false_negative_mask, _brute_force_mask(plan.batch(2), plan, rule))
