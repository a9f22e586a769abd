"""SimCSE's auxiliary masked-language-model loss, as one mean over every worker's masked tokens."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.training.masking import IGNORED


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the masked tokens' predictions, averaged over the global batch.

    The SimCSE reference computes ``CrossEntropyLoss`` over the masked tokens of its one
    batch. Here each worker holds a share of them: it returns their global mean (the same
    value on every rank) and a term whose DDP-averaged gradient is that mean's gradient,
    whatever the ranks' token counts (a mean of per-rank means would weigh a rank's few
    tokens like another's many).

    Args:
        logits: ``(m, vocab)`` scores at this worker's masked positions (and padding rows).
        labels: ``(m,)`` the original token ids there, -100 (ignored) at padding rows.

    Returns:
        ``(loss, loss_to_backward)``: the mean over every rank's masked tokens, and this
        rank's sum divided by the global count times the world size (DDP divides by it).
    """
    local_sum = F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=IGNORED)
    totals = torch.stack([local_sum.detach(), (labels != IGNORED).sum().float()])
    world = 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        dist.all_reduce(totals)
    count = totals[1].clamp(min=1.0)
    return totals[0] / count, local_sum / count * world
