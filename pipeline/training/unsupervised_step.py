"""Unsupervised SimCSE's step: each sentence's two dropout views are positives, the rest of
the global batch its negatives (:class:`UnsupervisedStep`), and the two views of a worker's
rows in one padded batch (:func:`two_views`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.config.train_section import INFONCE_DIRECTIONS
from pipeline.data.tokenized import CorpusShare, TokenizedCorpus
from pipeline.model.accel import to_device, train_autocast
from pipeline.training.augment import repeat_words
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.losses import global_batch_simcse_loss
from pipeline.training.masking import IGNORED, MaskingSpec, mask_tokens
from pipeline.training.mlm_loss import masked_lm_loss


@dataclass
class ViewBatch:
    """The host arrays of one worker's unsupervised step (:meth:`UnsupervisedStep.collate`)."""

    input_ids: np.ndarray
    """``(2n, width)`` int64: this worker's n rows, then their second view, right-padded."""
    attention_mask: np.ndarray
    """``(2n, width)`` int64, 1 for real tokens."""
    global_ids: np.ndarray
    """``(sum(sizes),)`` corpus positions of the whole global batch, rank order (a position is
    one distinct text, so it stands for the id): rows sharing one are not each other's negatives."""
    masked_ids: np.ndarray | None = None
    """``(2n, width)`` both views BERT-masked (``train.mlm_weight`` > 0), else None."""
    mlm_labels: np.ndarray | None = None
    """``(2n, width)`` the original ids at the masked positions, -100 elsewhere."""


@dataclass(frozen=True)
class UnsupervisedStep:
    """Unsupervised SimCSE: each sentence's two dropout views (the second with ESimCSE word
    repetition when ``dup_rate > 0``) are positives; every other sentence of the global
    batch is a negative.

    A call runs four stages, public so that ``bench.gpu_step`` can time them apart:
    :meth:`collate` (host), :meth:`upload` (host to device), :meth:`forward`, :meth:`loss`.
    """

    corpus: TokenizedCorpus | CorpusShare
    """Where the rows' tokens come from: the worker's :class:`CorpusShare` (its rows this
    epoch), or a whole :class:`TokenizedCorpus`."""
    temperature: float
    dup_rate: float
    """ESimCSE word repetition rate of the second view (0: none)."""
    device: torch.device
    bf16: bool | None = None
    """The forward pass under bf16 autocast (weights, gradients and loss stay fp32); None: where
    the device computes bf16 natively (:func:`~pipeline.model.accel.native_bf16`)."""
    mlm_weight: float = 0.0
    """SimCSE's auxiliary MLM objective: the loss is InfoNCE + ``mlm_weight`` x the masked
    tokens' cross-entropy (the reference's ``do_mlm`` with ``mlm_weight``; 0: off)."""
    masking: MaskingSpec | None = None
    """How the MLM copies are masked; needed when ``mlm_weight`` > 0 (the model then has an MLM head)."""
    directions: tuple[str, ...] = INFONCE_DIRECTIONS
    """``train.directions``: the loss's terms, the first view as the anchor
    (:func:`~pipeline.training.losses.simcse_loss`)."""

    def __call__(
        self, model: Any, batch: GlobalBatch, augment_rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`~pipeline.training.step.TrainStep`."""
        return self.on_device(model, self.collate(batch, augment_rng), batch.sizes)

    def collate(self, batch: GlobalBatch, augment_rng: np.random.Generator) -> ViewBatch:
        """This worker's rows as both views (:func:`two_views`), and the global batch's positions."""
        input_ids, mask = two_views(self.corpus, batch.local_rows, self.dup_rate, augment_rng)
        if self.mlm_weight <= 0:
            return ViewBatch(input_ids, mask, batch.rows)
        assert self.masking is not None
        # Each view masked on its own, as the reference masks each of its sentence copies.
        masked_ids, labels = mask_tokens(input_ids, mask, self.masking, augment_rng)
        return ViewBatch(input_ids, mask, batch.rows, masked_ids, labels)

    def on_device(
        self, model: Any, batch: ViewBatch, sizes: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`upload`, :meth:`forward` and :meth:`loss` of a collated batch, plus the MLM
        term where the batch carries masked copies."""
        input_ids, mask, global_ids = self.upload(batch)
        if batch.masked_ids is None:
            view1, view2 = self.forward(model, input_ids, mask)
            return self.loss(view1, view2, global_ids, sizes)
        masked_ids = to_device(batch.masked_ids, self.device)
        labels = to_device(batch.mlm_labels, self.device)
        positions = labels != IGNORED
        with train_autocast(self.device, self.bf16):
            embeddings, scores = model(input_ids, mask, masked=(masked_ids, positions))
        view1, view2 = embeddings.float().split(input_ids.shape[0] // 2)
        loss, backward = self.loss(view1, view2, global_ids, sizes)
        targets = labels[positions]
        targets = torch.nn.functional.pad(targets, (0, len(scores) - len(targets)), value=IGNORED)
        mlm, mlm_backward = masked_lm_loss(scores, targets)
        return loss + self.mlm_weight * mlm, backward + self.mlm_weight * mlm_backward

    def upload(self, batch: ViewBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask, global_ids)`` on the device (asynchronous on CUDA)."""
        return (
            to_device(batch.input_ids, self.device),
            to_device(batch.attention_mask, self.device),
            to_device(batch.global_ids, self.device),
        )

    def forward(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both views in one forward pass (the batch twice, stacked), under autocast.

        Returns:
            ``(view1, view2)``, each ``(n, d)`` fp32.
        """
        with train_autocast(self.device, self.bf16):
            embeddings = model(input_ids, attention_mask)
        return embeddings.float().split(input_ids.shape[0] // 2)

    def loss(
        self,
        view1: torch.Tensor,
        view2: torch.Tensor,
        global_ids: torch.Tensor,
        sizes: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`pipeline.training.losses.global_batch_simcse_loss` over every worker's views.

        Args:
            view1, view2: ``(sizes[rank], d)`` this worker's two views.
            global_ids: ``(sum(sizes),)`` corpus ids of the global batch.
            sizes: rows per rank.

        Returns:
            ``(loss, loss_to_backward)``, as :class:`~pipeline.training.step.TrainStep`.
        """
        return global_batch_simcse_loss(
            view1, view2, list(sizes), global_ids, self.temperature, directions=self.directions
        )


def two_views(
    corpus: TokenizedCorpus | CorpusShare, rows: np.ndarray, dup_rate: float, rng: np.random.Generator
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
