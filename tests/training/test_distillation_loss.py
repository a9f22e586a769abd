"""The distillation term against sentence-transformers' own ``DistillKLDivLoss`` and
``MarginMSELoss`` (rows with every negative present, as the peer's inputs always are), against
numpy where slots are missing, and over two gloo ranks with uneven rows equal to one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_on_two_ranks

from pipeline.training.distillation_loss import distillation_loss


def embeddings(rows: int, negatives: int, dim: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """Unit query, positive and negative columns, as the peer's loss takes them."""
    generator = torch.Generator().manual_seed(seed)
    columns = [torch.randn(rows, dim, generator=generator) for _ in range(2 + negatives)]
    return [torch.nn.functional.normalize(c, dim=1) for c in columns]


def student_scores(columns: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(columns[0] * other).sum(dim=1) for other in columns[1:]], dim=1)


class EmbeddedAs(torch.nn.Module):
    """The peer's losses want a model: never called, they are given the embeddings."""


@pytest.mark.parametrize("temperature", [1.0, 0.05])
def test_kl_is_sentence_transformers_distill_kl_div_loss(temperature):
    from sentence_transformers.losses import DistillKLDivLoss

    columns = embeddings(6, 3)
    teacher = torch.rand(6, 4) * 2 - 1
    peer = DistillKLDivLoss(EmbeddedAs(), temperature=temperature)
    expected = peer.compute_loss_from_embeddings(columns, teacher)
    present = torch.ones(6, 4, dtype=torch.bool)
    loss, backward = distillation_loss(
        student_scores(columns), teacher, present, kind="kl", temperature=temperature
    )
    # The peer's T² (Hinton's, for T > 1) is left out: see distillation_loss.
    assert loss.item() * temperature**2 == pytest.approx(expected.item(), rel=1e-5)
    assert backward.item() * temperature**2 == pytest.approx(expected.item(), rel=1e-5)  # one process


def test_margin_mse_is_sentence_transformers_margin_mse_loss():
    from sentence_transformers.losses import MarginMSELoss

    columns = embeddings(5, 3, seed=1)
    teacher = torch.rand(5, 4)
    expected = MarginMSELoss(EmbeddedAs()).compute_loss_from_embeddings(columns, teacher)
    present = torch.ones(5, 4, dtype=torch.bool)
    loss, _ = distillation_loss(student_scores(columns), teacher, present, kind="margin_mse")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def numpy_kl(
    student: np.ndarray, teacher: np.ndarray, present: np.ndarray, t: float, t_teacher: float | None = None
) -> float:
    """Each row with a negative: KL of its present candidates' softmaxes (the teacher's at
    ``t_teacher``, else ``t``); their mean."""
    terms = []
    t_teacher = t_teacher or t
    for s, q, keep in zip(student, teacher, present, strict=True):
        if keep[1:].any():
            p = np.exp(q[keep] / t_teacher) / np.exp(q[keep] / t_teacher).sum()
            log_r = s[keep] / t - np.log(np.exp(s[keep] / t).sum())
            terms.append((p * (np.log(p) - log_r)).sum())
    return float(np.mean(terms)) if terms else 0.0


def test_missing_negatives_are_left_out_of_both_losses():
    """Rows with fewer negatives than slots (the filters kept fewer), and a row with none."""
    rng = np.random.default_rng(2)
    student, teacher = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4))
    present = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 1, 0]], dtype=bool)
    args = (torch.tensor(student), torch.tensor(teacher), torch.tensor(present))
    kl, _ = distillation_loss(*args, kind="kl", temperature=0.5)
    assert kl.item() == pytest.approx(numpy_kl(student, teacher, present, 0.5), rel=1e-6)
    margins = (student[:, :1] - student[:, 1:]) - (teacher[:, :1] - teacher[:, 1:])
    mse, _ = distillation_loss(*args, kind="margin_mse")
    assert mse.item() == pytest.approx(float((margins[present[:, 1:]] ** 2).mean()), rel=1e-6)
    # Gradients stay finite where a slot is missing.
    scores = torch.tensor(student, requires_grad=True)
    distillation_loss(scores, *args[1:], kind="kl", temperature=0.5)[1].backward()
    assert torch.isfinite(scores.grad).all() and scores.grad[2].abs().sum() == 0


def test_a_teacher_whose_scores_are_logits_is_read_at_its_own_temperature():
    """A cross-encoder's logits (T_t = 1) against the student's cosines (T = 0.05): the KL of
    softmax(logits) and softmax(cosines / T); MarginMSE of the cosine margins against the logit
    margins x T, i.e. (the student's logit margin - the teacher's)² x T²."""
    rng = np.random.default_rng(3)
    student, logits = rng.uniform(-1, 1, (5, 4)), rng.uniform(-8, 8, (5, 4))
    present = np.ones((5, 4), dtype=bool)
    present[1, 2:] = False
    args = (torch.tensor(student), torch.tensor(logits), torch.tensor(present))
    kl, _ = distillation_loss(*args, kind="kl", temperature=0.05, teacher_temperature=1.0)
    assert kl.item() == pytest.approx(numpy_kl(student, logits, present, 0.05, 1.0), rel=1e-5)
    # Read at the student's temperature instead, the logits make a near one-hot target.
    assert kl.item() != pytest.approx(numpy_kl(student, logits, present, 0.05), rel=1e-2)
    margins = (student[:, :1] - student[:, 1:]) / 0.05 - (logits[:, :1] - logits[:, 1:])
    mse, _ = distillation_loss(*args, kind="margin_mse", temperature=0.05, teacher_temperature=1.0)
    assert mse.item() == pytest.approx(float((margins[present[:, 1:]] ** 2).mean()) * 0.05**2, rel=1e-5)
    # Unset, the teacher's temperature is the student's: its scores are on the student's scale.
    for kind in ("kl", "margin_mse"):
        same, _ = distillation_loss(*args, kind=kind, temperature=0.05, teacher_temperature=0.05)
        unset, _ = distillation_loss(*args, kind=kind, temperature=0.05)
        assert same.item() == pytest.approx(unset.item(), rel=1e-6)


def test_no_negatives_anywhere_is_zero_and_an_unknown_kind_is_named():
    none = torch.zeros(3, 2, dtype=torch.bool)
    none[:, 0] = True
    for kind in ("kl", "margin_mse"):
        assert distillation_loss(torch.rand(3, 2), torch.rand(3, 2), none, kind=kind)[0].item() == 0.0
    with pytest.raises(ValueError, match="must be one of kl, margin_mse .got 'mse'"):
        distillation_loss(torch.rand(3, 2), torch.rand(3, 2), none, kind="mse")


def _rank_gradient(rank: int, kind: str, student, teacher, present, cuts):
    import torch.distributed as dist

    lo, hi = cuts[rank], cuts[rank + 1]
    scores = student[lo:hi].clone().requires_grad_(True)
    loss, backward = distillation_loss(scores, teacher[lo:hi], present[lo:hi], kind=kind, temperature=0.5)
    backward.backward()
    grad = torch.zeros_like(student)
    grad[lo:hi] = scores.grad / 2  # DDP's gradient: the mean over ranks
    dist.all_reduce(grad)
    return loss.item(), grad.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
def test_two_ranks_with_uneven_rows_get_the_one_process_gradient(kind):
    torch.manual_seed(0)
    student, teacher = torch.rand(9, 3), torch.rand(9, 3)
    present = torch.rand(9, 3) > 0.3
    present[:, 0] = True
    # 2 rows on rank 0, 7 on rank 1
    loss, grad = run_on_two_ranks(_rank_gradient, kind, student, teacher, present, (0, 2, 9))
    whole = student.clone().requires_grad_(True)
    expected, backward = distillation_loss(whole, teacher, present, kind=kind, temperature=0.5)
    backward.backward()  # one process: the mean itself
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert np.allclose(grad, whole.grad.numpy(), atol=1e-6)
