"""simcse_loss against hand computation and an independent numpy implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.training.losses import simcse_loss


def _numpy_infonce(a, p, t, h=None, w=0.0, ids=None, present=None, flagged=None, flagged_negatives=None):
    """Independent reference: explicit per-row softmax in float64. ``h`` is (n, d) or
    (n, m, d); ``present`` (n, m) marks which negatives exist; ``flagged`` (n, n) marks
    in-batch candidates p_j (j != i) left out of row i's softmax; ``flagged_negatives``
    (n, n, m) does the same for row j's k-th hard negative in row i."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    p = p / np.linalg.norm(p, axis=1, keepdims=True)
    n = len(a)
    total = 0.0
    for i in range(n):
        logits = []  # (is the positive, logit)
        for j in range(n):
            if ids is not None and j != i and ids[j] == ids[i]:
                continue
            if flagged is not None and j != i and flagged[i, j]:
                continue
            logits.append((j == i, a[i] @ p[j] / t))
        if h is not None:
            h3 = h[:, None, :] if h.ndim == 2 else h
            for j in range(n):
                for k in range(h3.shape[1]):
                    if present is not None and not present[j, k]:
                        continue
                    if flagged_negatives is not None and flagged_negatives[i, j, k]:
                        continue
                    hv = h3[j, k] / np.linalg.norm(h3[j, k])
                    logits.append((False, a[i] @ hv / t + (w if j == i else 0.0)))
        values = np.array([v for _, v in logits])
        target = next(v for is_pos, v in logits if is_pos)
        top = values.max()
        total += -(target - top - np.log(np.exp(values - top).sum()))
    return total / n


def test_two_by_two_by_hand():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # cos(a_i, p_i) = 1, cos(a_i, p_j) = 0; with t = 1 each row is -log(e / (e + 1)).
    expected = math.log(1 + math.exp(-1))
    assert simcse_loss(a, a.clone(), temperature=1.0).item() == pytest.approx(expected, rel=1e-6)
    # Temperature 0.5 doubles the logits: -log(e^2 / (e^2 + 1)).
    assert simcse_loss(a, a.clone(), temperature=0.5).item() == pytest.approx(
        math.log(1 + math.exp(-2)), rel=1e-6
    )
    # Scaling a vector does not change cosine similarity.
    assert simcse_loss(a * 3, a * 0.2, temperature=1.0).item() == pytest.approx(expected, rel=1e-6)


def test_two_by_two_hard_negative_by_hand():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    h = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # row 0's negative is row 1's direction and vice versa
    # Row 0 logits: [1, 0 | 0 + w, 1]; target 1.
    for w in (0.0, 0.7):
        row = -(1 - math.log(math.exp(1) + math.exp(0) + math.exp(w) + math.exp(1)))
        got = simcse_loss(a, a.clone(), temperature=1.0, hard_negatives=h, hard_negative_weight=w).item()
        assert got == pytest.approx(row, rel=1e-6)


@pytest.mark.parametrize("with_negatives,weight", [(False, 0.0), (True, 0.0), (True, 1.5)])
def test_matches_numpy_reference(with_negatives, weight):
    rng = np.random.default_rng(0)
    a, p, h = (rng.normal(size=(7, 5)) for _ in range(3))
    got = simcse_loss(
        torch.tensor(a),
        torch.tensor(p),
        temperature=0.05,
        hard_negatives=torch.tensor(h) if with_negatives else None,
        hard_negative_weight=weight,
    ).item()
    want = _numpy_infonce(a, p, 0.05, h if with_negatives else None, weight)
    assert got == pytest.approx(want, rel=1e-5)


def test_same_id_rows_are_not_negatives():
    rng = np.random.default_rng(1)
    a, p = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    ids = np.array([10, 11, 10, 12, 13, 11])
    got = simcse_loss(torch.tensor(a), torch.tensor(p), temperature=0.1, row_ids=torch.tensor(ids)).item()
    assert got == pytest.approx(_numpy_infonce(a, p, 0.1, ids=ids), rel=1e-6)
    unmasked = simcse_loss(torch.tensor(a), torch.tensor(p), temperature=0.1).item()
    assert got != pytest.approx(unmasked, rel=1e-3)


def test_gradient_flows_and_bad_inputs_are_rejected():
    a = torch.randn(4, 3, requires_grad=True)
    simcse_loss(a, torch.randn(4, 3)).backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()
    with pytest.raises(ValueError, match="temperature"):
        simcse_loss(torch.randn(2, 3), torch.randn(2, 3), temperature=0.0)
    with pytest.raises(ValueError, match="differ"):
        simcse_loss(torch.randn(2, 3), torch.randn(3, 3))


@pytest.mark.parametrize("weight", [0.0, 0.8])
def test_several_negatives_per_row_with_absent_slots(weight):
    rng = np.random.default_rng(4)
    a, p = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
    h = rng.normal(size=(5, 3, 6))
    present = rng.random((5, 3)) < 0.6
    present[0] = False  # a row with no negative at all
    got = simcse_loss(
        torch.tensor(a),
        torch.tensor(p),
        temperature=0.07,
        hard_negatives=torch.tensor(h),
        hard_negative_weight=weight,
        hard_negative_mask=torch.tensor(present),
    ).item()
    assert got == pytest.approx(_numpy_infonce(a, p, 0.07, h, weight, present=present), rel=1e-5)
    # (n, d) is the m = 1 case.
    single = simcse_loss(
        torch.tensor(a),
        torch.tensor(p),
        0.07,
        hard_negatives=torch.tensor(h[:, 0]),
        hard_negative_weight=weight,
    ).item()
    assert single == pytest.approx(_numpy_infonce(a, p, 0.07, h[:, 0], weight), rel=1e-5)


def test_false_negative_mask_leaves_hard_negatives_and_duplicates_as_they_are():
    """The mask removes in-batch candidates only; hard negatives keep their weight, and a
    flagged same-id duplicate is removed once."""
    rng = np.random.default_rng(5)
    a, p = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    h = rng.normal(size=(6, 2, 4))
    ids = np.array([1, 2, 1, 3, 4, 5])
    flagged = rng.random((6, 6)) < 0.4
    flagged[0, 2] = True  # also a same-id duplicate of row 0
    got = simcse_loss(
        torch.tensor(a),
        torch.tensor(p),
        temperature=0.1,
        hard_negatives=torch.tensor(h),
        hard_negative_weight=0.5,
        row_ids=torch.tensor(ids),
        false_negative_mask=torch.tensor(flagged),
    ).item()
    want = _numpy_infonce(a, p, 0.1, h, 0.5, ids=ids, flagged=flagged)
    assert got == pytest.approx(want, rel=1e-6)
    assert got != pytest.approx(_numpy_infonce(a, p, 0.1, h, 0.5, ids=ids), rel=1e-3)


def test_a_wide_false_negative_mask_also_covers_hard_negative_columns():
    """``(n, n + n*m)``: another row's hard negative that is a known positive of row i is
    removed from row i's softmax only; the diagonal is never masked."""
    rng = np.random.default_rng(8)
    n, m = 5, 2
    a, p, h = rng.normal(size=(n, 4)), rng.normal(size=(n, 4)), rng.normal(size=(n, m, 4))
    in_batch = rng.random((n, n)) < 0.3
    on_negatives = rng.random((n, n, m)) < 0.3
    wide = np.concatenate([in_batch | np.eye(n, dtype=bool), on_negatives.reshape(n, n * m)], axis=1)
    got = simcse_loss(
        torch.tensor(a), torch.tensor(p), temperature=0.1, hard_negatives=torch.tensor(h),
        false_negative_mask=torch.tensor(wide),
    ).item()  # fmt: skip
    want = _numpy_infonce(a, p, 0.1, h, flagged=in_batch, flagged_negatives=on_negatives)
    assert got == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="false_negative_mask"):
        simcse_loss(
            torch.tensor(a), torch.tensor(p), hard_negatives=torch.tensor(h),
            false_negative_mask=torch.ones(n, n + 1, dtype=torch.bool),
        )  # fmt: skip


def _masked_inputs(seed: int, n: int = 8, d: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Anchors, positives and a random flag mask (diagonal included: it must be ignored)."""
    rng = np.random.default_rng(seed)
    flagged = rng.random((n, n)) < 0.35
    flagged[0, 1:] = True  # row 0 keeps its positive only: no NaN from an all-removed row
    return (
        torch.tensor(rng.normal(size=(n, d))),
        torch.tensor(rng.normal(size=(n, d))),
        torch.tensor(flagged),
    )


def test_the_false_negative_mask_removes_the_flagged_candidates():
    anchors, positives, flagged = _masked_inputs(0)
    t = 0.1
    got = simcse_loss(anchors, positives, t, false_negative_mask=flagged)

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


def test_a_removed_candidate_neither_moves_the_loss_nor_gets_a_gradient():
    """Candidate p_j flagged for every other row. p_j is also row j's own positive; with
    anchor j at zero, row j's term is log(#candidates) whatever p_j is, so p_j reaches the
    loss only as the others' candidate: exactly what the mask removes."""
    anchors, positives, _ = _masked_inputs(2)
    n, j, t = len(anchors), 3, 0.05
    anchors[j] = 0.0
    flagged = torch.zeros((n, n), dtype=torch.bool)
    flagged[:, j] = True  # (j, j) too: the diagonal is ignored

    def loss_and_grad(p: torch.Tensor, mask: torch.Tensor | None):
        p = p.clone().requires_grad_(True)
        loss = simcse_loss(anchors, p, t, false_negative_mask=mask)
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
    # The other candidates still get gradient; and without the mask, p_j gets one and moves
    # the loss (the check above is not vacuous).
    assert torch.count_nonzero(grad[np.arange(n) != j]) > 0
    loss, grad = loss_and_grad(positives, None)
    assert torch.count_nonzero(grad[j]) > 0
    assert loss_and_grad(moved, None)[0] != pytest.approx(loss, rel=1e-6)


def test_the_false_negative_mask_shape_is_checked():
    anchors, positives, flagged = _masked_inputs(3)
    with pytest.raises(ValueError, match="false_negative_mask"):
        simcse_loss(anchors, positives, false_negative_mask=flagged[:-1])


def test_known_positives_of_an_anchor_are_never_its_in_batch_negatives():
    """Pairs task: rows 0 and 1 share an anchor (both positives are known positives of it), and
    row 2's mined negative is row 0's positive text."""
    from pipeline.training.triplet_step import known_positive_candidates

    anchors = np.array([10, 10, 11, 12])
    positives = np.array([20, 21, 22, 23])
    negatives = np.array([[24], [-1], [20], [21]])
    base = 100
    known = np.unique(np.array([10 * base + 20, 10 * base + 21, 11 * base + 22, 12 * base + 23]))
    got = known_positive_candidates(anchors, positives, negatives, known, base)
    want = np.zeros((4, 8), dtype=bool)
    want[0, [0, 1]] = want[1, [0, 1]] = True  # same anchor: each other's positive (and their own)
    want[0, 4 + 2] = want[1, 4 + 2] = True  # row 2's negative (text 20) is a positive of anchor 10
    want[0, 4 + 3] = want[1, 4 + 3] = True  # row 3's negative (text 21) too
    want[2, 2] = want[3, 3] = True  # their own positives, which the loss never masks
    assert (got == want).all()


@pytest.mark.parametrize(
    ("m", "strength", "weight"), [(1, 2.0, 0.0), (3, 5.0, 0.0), (3, 2.0, 0.8), (2, 0.0, 0.0)]
)
def test_hardness_weighting_is_sentence_transformers_mnrl_hard_negatives_mode(m, strength, weight):
    """``hardness_strength`` against sentence-transformers' own implementation
    (``MultipleNegativesRankingLoss(hardness_mode="hard_negatives")``, Lan et al. 2025 Eq. 5):
    the same loss and the same gradients on the same embeddings. Its columns are the positives,
    then each negative slot for every row; ours interleave a row's slots. A softmax does not
    care. SimCSE's constant weight has no counterpart there; it reaches its logits here as a bias
    b on the own-negative cosines, which both its scale (1/t) and its hardness term (alpha)
    multiply: b = w / (1/t + alpha) adds exactly w to each such logit."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    t, n, d = 0.05, 6, 8
    rng = np.random.default_rng(11)
    a, p, h = (torch.tensor(rng.normal(size=s), dtype=torch.float32, requires_grad=True)
               for s in ((n, d), (n, d), (n, m, d)))  # fmt: skip
    ours = simcse_loss(a, p, t, hard_negatives=h, hardness_strength=strength, hard_negative_weight=weight)
    ours_grads = torch.autograd.grad(ours, (a, p, h))

    def cos_with_simcse_weight(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sims = F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T
        own = (torch.arange(len(y)) % n)[None, :] == torch.arange(len(x))[:, None]
        own[:, :n] = False  # the positives' columns
        return sims + weight / (1 / t + strength) * own

    mode = {"hardness_mode": "hard_negatives", "hardness_strength": strength} if strength else {}
    loss = MultipleNegativesRankingLoss(None, scale=1 / t, similarity_fct=cos_with_simcse_weight, **mode)
    theirs = loss.compute_loss_from_embeddings([a, p, *h.unbind(dim=1)], None)
    theirs_grads = torch.autograd.grad(theirs, (a, p, h))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    for mine, reference in zip(ours_grads, theirs_grads, strict=True):
        assert torch.allclose(mine, reference, atol=1e-6)
    if strength:  # and it is not the loss without it
        assert ours.item() != pytest.approx(
            simcse_loss(a, p, t, hard_negatives=h, hard_negative_weight=weight).item()
        )


GTE = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")


@pytest.mark.parametrize(
    ("directions", "m", "strength"),
    [
        (("query_to_doc", "doc_to_query"), 0, 0.0),
        (("query_to_doc", "doc_to_query"), 2, 0.0),
        (("query_to_doc", "query_to_query"), 1, 0.0),
        (("query_to_doc", "doc_to_doc"), 3, 0.0),
        (GTE, 0, 0.0),
        (GTE, 2, 2.0),
    ],
)
def test_directions_are_sentence_transformers_mnrl_joint_directions(directions, m, strength):
    """``directions`` against sentence-transformers' ``MultipleNegativesRankingLoss(directions=...,
    partition_mode="joint")`` on the same embeddings, with and without hard negatives and with
    its hardness weighting: the same loss and the same gradients. All four are GTE's improved
    contrastive loss; with one direction more the loss differs from InfoNCE's."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    t, n, d = 0.05, 6, 8
    rng = np.random.default_rng(12)
    a, p = (torch.tensor(rng.normal(size=(n, d)), dtype=torch.float32, requires_grad=True) for _ in range(2))
    h = torch.tensor(rng.normal(size=(n, m, d)), dtype=torch.float32, requires_grad=True) if m else None
    inputs = (a, p) if h is None else (a, p, h)
    ours = simcse_loss(a, p, t, hard_negatives=h, hardness_strength=strength, directions=directions)
    ours_grads = torch.autograd.grad(ours, inputs)
    mode = {"hardness_mode": "hard_negatives", "hardness_strength": strength} if strength else {}
    loss = MultipleNegativesRankingLoss(
        None, scale=1 / t, directions=directions, partition_mode="joint", **mode
    )
    theirs = loss.compute_loss_from_embeddings([a, p, *([] if h is None else h.unbind(dim=1))], None)
    theirs_grads = torch.autograd.grad(theirs, inputs)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    for mine, reference in zip(ours_grads, theirs_grads, strict=True):
        assert torch.allclose(mine, reference, atol=1e-6)
    infonce = simcse_loss(a, p, t, hard_negatives=h, hardness_strength=strength).item()
    assert ours.item() != pytest.approx(infonce)


def _numpy_gte(a, p, t, h, ids, flagged, flagged_negatives, present):
    """Independent reference of the four directions in one softmax a row, float64, with the
    masks' rule written out: in-batch j is row i's partner where ``ids`` match or ``flagged[i,
    j]``; query_to_query and doc_to_doc leave out partners either way, doc_to_query the anchors
    j that row i is a partner of, doc_to_doc also row i's own, absent and flagged negatives."""
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    a, p, h = unit(a), unit(p), unit(h)
    n, m = h.shape[:2]
    partner = np.array([[j != i and (ids[i] == ids[j] or flagged[i, j]) for j in range(n)] for i in range(n)])
    total = 0.0
    for i in range(n):
        logits = [a[i] @ p[j] for j in range(n) if not partner[i, j]]
        logits += [
            a[i] @ h[j, k]
            for j in range(n)
            for k in range(m)
            if present[j, k] and not flagged_negatives[i, j, k]
        ]
        logits += [a[i] @ a[j] for j in range(n) if j != i and not (partner[i, j] or partner[j, i])]
        logits += [p[i] @ a[j] for j in range(n) if not partner[j, i]]
        logits += [p[i] @ p[j] for j in range(n) if j != i and not (partner[i, j] or partner[j, i])]
        logits += [
            p[i] @ h[j, k]
            for j in range(n)
            for k in range(m)
            if j != i and present[j, k] and not flagged_negatives[i, j, k]
        ]
        logits = np.array(logits) / t
        total += np.log(np.exp(logits - logits.max()).sum()) + logits.max() - a[i] @ p[i] / t
    return total / n


def test_directions_leave_out_what_the_masks_relate_in_every_term():
    """With duplicates (``row_ids``), known positives (``false_negative_mask`` over in-batch
    candidates and hard negatives) and absent negative slots, GTE's four directions equal the
    reference that writes the rule out row by row: a sentence the masks call row i's positive
    is no negative of its anchor or its document in any term."""
    t, n, m, d = 0.05, 6, 2, 8
    rng = np.random.default_rng(13)
    a, p = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    h = rng.normal(size=(n, m, d))
    ids = np.array([0, 1, 1, 2, 3, 4])  # rows 1 and 2 share a positive text
    present = np.ones((n, m), dtype=bool)
    present[4, 1] = False
    flagged = np.zeros((n, n), dtype=bool)
    flagged[0, 3] = True  # row 3's positive is a known positive of anchor 0 (not the reverse)
    flagged_negatives = np.zeros((n, n, m), dtype=bool)
    flagged_negatives[5, 0, 1] = True  # row 0's second negative is a known positive of anchor 5
    mask = np.concatenate([flagged, flagged_negatives.reshape(n, n * m)], axis=1)
    ours = simcse_loss(
        *(torch.tensor(x, dtype=torch.float32) for x in (a, p)), t,
        hard_negatives=torch.tensor(h, dtype=torch.float32), row_ids=torch.tensor(ids),
        hard_negative_mask=torch.tensor(present), false_negative_mask=torch.tensor(mask), directions=GTE,
    )  # fmt: skip
    want = _numpy_gte(a, p, t, h, ids, flagged, flagged_negatives, present)
    assert ours.item() == pytest.approx(want, rel=1e-5)
    unmasked = simcse_loss(
        *(torch.tensor(x, dtype=torch.float32) for x in (a, p)), t,
        hard_negatives=torch.tensor(h, dtype=torch.float32), directions=GTE,
    )  # fmt: skip
    assert unmasked.item() != pytest.approx(want, rel=1e-3)


def test_an_unknown_direction_or_one_without_query_to_doc_is_refused():
    x = torch.randn(4, 8)
    for directions in (("doc_to_query",), ("query_to_doc", "docs_to_query")):
        with pytest.raises(ValueError, match="directions must include query_to_doc"):
            simcse_loss(x, x, 0.05, directions=directions)
