"""SimCSE's auxiliary masked-language-model loss, as one mean over every worker's masked tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.training.losses import mean_over_ranks
from pipeline.training.masking import IGNORED


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the masked tokens' predictions, averaged over the global batch.

    The SimCSE reference computes ``CrossEntropyLoss`` over the masked tokens of its one
    batch. Here each worker holds a share of them: it returns their global mean
    (:func:`~pipeline.training.losses.mean_over_ranks`).

    Args:
        logits: ``(m, vocab)`` scores at this worker's masked positions (and padding rows).
        labels: ``(m,)`` the original token ids there, -100 (ignored) at padding rows.

    Returns:
        ``(loss, loss_to_backward)``: the mean over every rank's masked tokens, and this
        rank's sum divided by the global count times the world size (DDP divides by it).
    """
    local_sum = F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=IGNORED)
    return mean_over_ranks(local_sum, (labels != IGNORED).sum())
