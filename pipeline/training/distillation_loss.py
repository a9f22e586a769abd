"""Distillation from a teacher's scores of each row's candidates, beside InfoNCE: the student's
similarities of an anchor with its positive and its hard negatives are pulled towards the
teacher's scores of the same pairs, as a distribution (KL, sentence-transformers'
``DistillKLDivLoss``) or as margins (MSE, its ``MarginMSELoss``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.training.losses import mean_over_ranks

DISTILLATION_LOSSES = ("kl", "margin_mse")


def distillation_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    present: torch.Tensor,
    *,
    kind: str,
    temperature: float = 1.0,
    teacher_temperature: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's scores of each row's candidates against the teacher's, averaged over the
    global batch.

    Args:
        student: ``(n, 1 + k)`` the student's similarity of each of this worker's rows' anchor
            with its positive (column 0) and its ``k`` hard-negative slots.
        teacher: ``(n, 1 + k)`` the teacher's scores of the same pairs (no gradient).
        present: ``(n, 1 + k)`` bool, False where a row has no negative in that slot (column
            0, the positive, is always True).
        kind: ``kl``: KL(softmax(teacher / T_t) || softmax(student / T)) a row, the
            candidates a row lacks left out of both softmaxes, averaged over the rows with at
            least one negative: sentence-transformers' ``DistillKLDivLoss`` divided by its T².
            Hinton's T² keeps the gradient's scale at T > 1; at InfoNCE's T = 0.05 it would
            shrink the term 400-fold, so without it a weight of 1 puts the term's gradient on
            InfoNCE's scale (both are cross-entropies over the same logits s / T);
            ``margin_mse``: the squared error of the student's margins (positive less
            negative) against the teacher's brought to the student's scale (x T / T_t: a
            cross-encoder's logit margin m is the cosine margin m x T that InfoNCE reads as the
            logit margin m), averaged over the present negatives.
        temperature: ``T``, the student's (InfoNCE's ``train.temperature``).
        teacher_temperature: ``T_t``, at which the teacher's scores are logits
            (``mining.teacher.temperature``); None: ``T`` (scores on the student's scale).

    Returns:
        ``(loss, loss_to_backward)``: the mean over every rank's terms (rows for ``kl``,
        negatives for ``margin_mse``; 0 where there are none), as
        :func:`~pipeline.training.losses.mean_over_ranks` returns it.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind not in DISTILLATION_LOSSES:
        raise ValueError(f"distillation loss must be one of {', '.join(DISTILLATION_LOSSES)} (got {kind!r})")
    student, teacher = student.float(), teacher.detach().float()
    # The teacher's scores as cosines on the student's scale: its logits (teacher / T_t) are the
    # logits InfoNCE reads from those cosines (/ T).
    teacher = teacher * (temperature / (teacher_temperature or temperature))
    negatives = present[:, 1:]
    if kind == "kl":
        # Absent slots: -inf gives the teacher's softmax an exact 0 there; the student's
        # log-probability is only ever multiplied by that 0, so a finite stand-in keeps it from nan.
        teacher_probs = torch.softmax((teacher / temperature).masked_fill(~present, float("-inf")), dim=1)
        student_logs = torch.log_softmax((student / temperature).masked_fill(~present, -1e4), dim=1)
        per_row = F.kl_div(student_logs, teacher_probs, reduction="none").sum(dim=1)
        counted = negatives.any(dim=1)
        local_sum, count = (per_row * counted).sum(), counted.sum()
    else:
        student_margins = student[:, :1] - student[:, 1:]
        teacher_margins = teacher[:, :1] - teacher[:, 1:]
        local_sum = ((student_margins - teacher_margins) ** 2 * negatives).sum()
        count = negatives.sum()
    return mean_over_ranks(local_sum, count)
