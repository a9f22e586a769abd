"""One SimCSE training step's forward pass and loss, on this worker's share of the global batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.config.schema import Config
from pipeline.data.pairs import Triplets
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.model.accel import autocast, to_device
from pipeline.training.augment import repeat_words
from pipeline.training.losses import gather_across_workers, simcse_loss


def triplet_batch_loss(
    ddp_model: Any,
    corpus: TokenizedCorpus,
    triplets: Triplets,
    mined: np.ndarray | None,
    local_rows: np.ndarray,
    global_rows: np.ndarray,
    sizes: list[int],
    cfg: Config,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Supervised SimCSE on this worker's triplet rows, negatives gathered from all workers.

    Each row's negatives are its given one (if any) and its mined ones (if a refresh has
    happened): ``1 + num_negatives`` slots, absent ones masked. Anchors, positives and the
    present negatives go through the encoder in one forward pass.

    Returns ``(loss, loss_to_backward)`` as :func:`global_batch_simcse_loss` does.
    """
    negatives = triplets.negative[local_rows][:, None]
    if mined is not None:
        negatives = np.concatenate([negatives, mined[local_rows]], axis=1)
    present = negatives >= 0
    texts = np.concatenate([triplets.anchor[local_rows], triplets.positive[local_rows], negatives[present]])
    input_ids, mask = corpus.batch(texts)
    with autocast(device):
        embeddings = ddp_model(to_device(input_ids, device), to_device(mask, device)).float()
    n = len(local_rows)
    present_t = to_device(present, device)
    negative_embeddings = embeddings.new_zeros((n, negatives.shape[1], embeddings.shape[1]))
    negative_embeddings[present_t] = embeddings[2 * n :]
    loss = simcse_loss(
        gather_across_workers(embeddings[:n], sizes),
        gather_across_workers(embeddings[n : 2 * n], sizes),
        temperature=cfg.train.temperature,
        hard_negatives=gather_across_workers(negative_embeddings, sizes),
        hard_negative_weight=cfg.train.hard_negative_weight,
        # Rows sharing a positive text (a premise with several hypotheses) are not each
        # other's negatives.
        row_ids=to_device(corpus.ids[triplets.positive[global_rows]], device),
        hard_negative_mask=gather_across_workers(present_t.float(), sizes) > 0.5,
    )
    return loss, loss * len(sizes)


def two_views(
    corpus: TokenizedCorpus, rows: np.ndarray, dup_rate: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(2n, width)`` ids and mask: the rows, then the rows again (with ESimCSE word
    repetition when ``dup_rate > 0``), padded to one width for a single forward pass."""
    input_ids, mask = corpus.batch(rows)
    if dup_rate <= 0:
        return np.concatenate([input_ids, input_ids]), np.concatenate([mask, mask])
    second_ids, second_mask = repeat_words(input_ids, mask, dup_rate, rng, corpus.pad_token_id)
    width = second_ids.shape[1]  # repetition only lengthens rows
    pad = width - input_ids.shape[1]
    input_ids = np.pad(input_ids, ((0, 0), (0, pad)), constant_values=corpus.pad_token_id)
    mask = np.pad(mask, ((0, 0), (0, pad)))
    return np.concatenate([input_ids, second_ids]), np.concatenate([mask, second_mask])
