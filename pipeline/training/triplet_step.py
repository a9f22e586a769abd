"""Supervised SimCSE's step on triplet rows (:class:`TripletStep`): anchor, positive, and the
row's given and mined negatives, with every known positive of a row's anchor kept out of its
negatives (:func:`known_positive_candidates`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.config.train_section import INFONCE_DIRECTIONS
from pipeline.data.tokenized import CorpusShare, TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.model.accel import to_device, train_autocast
from pipeline.training.distillation_loss import distillation_loss
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.losses import gather_across_workers, simcse_loss


@dataclass(frozen=True)
class TripletStep:
    """Supervised SimCSE on triplet rows, negatives gathered from all workers.

    Each row's negatives are its given one (if any) and its mined ones (if a refresh has
    happened): ``1 + num_negatives`` slots, absent ones masked. The anchors go through the
    encoder in one forward pass, the positives and present negatives in a second, each padded
    to its own longest text. Rows sharing a positive text (a premise with several hypotheses)
    are not each other's negatives, and neither are rows sharing an anchor text (a headline
    with several paraphrases: each row's positive is a known positive of the other's anchor).
    """

    corpus: TokenizedCorpus | CorpusShare
    """Where the texts' tokens come from: the worker's :class:`CorpusShare` (the texts of its
    rows this epoch), or a whole :class:`TokenizedCorpus`."""
    triplets: Triplets
    temperature: float
    hard_negative_weight: float
    """Added to the logit of each row's own hard negatives (SimCSE's supervised weight)."""
    device: torch.device
    distill_weight: float = 0.0
    """The loss is InfoNCE + ``distill_weight`` x :func:`~pipeline.training.distillation_loss.
    distillation_loss` of the teacher's scores of each row's positive and mined negatives
    (``train.distill_weight``), where the batch carries them; 0: off."""
    distill_loss: str = "kl"
    """``train.distill_loss``: ``kl`` or ``margin_mse``."""
    teacher_temperature: float | None = None
    """``mining.teacher.temperature``: at which the teacher's scores are logits; None: the
    student's ``temperature``."""
    hardness_strength: float = 0.0
    """``train.hardness_strength``: the hardness weight of each row's own hard negatives
    (:func:`~pipeline.training.losses.simcse_loss`); 0: off."""
    directions: tuple[str, ...] = INFONCE_DIRECTIONS
    """``train.directions``: the loss's terms (:func:`~pipeline.training.losses.simcse_loss`)."""
    bf16: bool | None = None
    """Forward passes under bf16 autocast (weights, gradients and loss stay fp32); None: where
    the device computes bf16 natively (:func:`~pipeline.model.accel.native_bf16`)."""

    @functools.cached_property
    def _known_pairs(self) -> tuple[np.ndarray, int]:
        """Every training row's (anchor, positive) as sorted codes, and the code base."""
        base = self.corpus.num_texts + 1
        return np.unique(self.triplets.anchor.astype(np.int64) * base + self.triplets.positive), base

    def known_positive_candidates(self, rows: np.ndarray, negatives: np.ndarray) -> np.ndarray:
        """:func:`known_positive_candidates` of the global batch ``rows`` with their negatives."""
        known, base = self._known_pairs
        return known_positive_candidates(
            self.triplets.anchor[rows], self.triplets.positive[rows], negatives, known, base
        )

    def __call__(
        self, model: Any, batch: GlobalBatch, augment_rng: np.random.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`~pipeline.training.step.TrainStep`; ``batch.rows`` are triplet rows,
        ``augment_rng`` is unused."""
        local_rows, sizes = batch.local_rows, list(batch.sizes)
        triplets, device = self.triplets, self.device
        negatives = triplets.negative[local_rows][:, None]
        if batch.mined is not None:
            negatives = np.concatenate([negatives, batch.local_mined], axis=1)
        present = negatives >= 0
        global_negatives = triplets.negative[batch.rows][:, None]
        if batch.mined is not None:
            global_negatives = np.concatenate([global_negatives, batch.mined], axis=1)
        # Queries and documents are padded apart, as sentence-transformers pads each column: short
        # queries (headlines) padded to the longest document would be computed for nothing.
        groups = (
            triplets.anchor[local_rows],
            np.concatenate([triplets.positive[local_rows], negatives[present]]),
        )
        with train_autocast(device, self.bf16):
            embeddings = torch.cat([
                model(to_device(input_ids, device), to_device(mask, device))
                for input_ids, mask in map(self.corpus.batch, groups)
            ]).float()  # fmt: skip
        n = len(local_rows)
        present_t = to_device(present, device)
        negative_embeddings = embeddings.new_zeros((n, negatives.shape[1], embeddings.shape[1]))
        negative_embeddings[present_t] = embeddings[2 * n :]
        loss = simcse_loss(
            gather_across_workers(embeddings[:n], sizes),
            gather_across_workers(embeddings[n : 2 * n], sizes),
            temperature=self.temperature,
            hard_negatives=gather_across_workers(negative_embeddings, sizes),
            hard_negative_weight=self.hard_negative_weight,
            hardness_strength=self.hardness_strength,
            directions=self.directions,
            # Positions stand for ids: one position is one distinct text.
            row_ids=to_device(triplets.positive[batch.rows], device),
            hard_negative_mask=gather_across_workers(present_t.float(), sizes) > 0.5,
            false_negative_mask=to_device(
                self.known_positive_candidates(batch.rows, global_negatives), device
            ),
        )
        # Every rank backpropagates through its own rows only; DDP averages over the ranks.
        backward = loss * len(sizes)
        if self.distill_weight > 0 and batch.local_teacher_scores is not None:
            distilled, distilled_backward = self._distilled(
                embeddings[:n], embeddings[n : 2 * n], negative_embeddings[:, 1:], present[:, 1:],
                batch.local_teacher_scores,
            )  # fmt: skip
            loss = loss + self.distill_weight * distilled
            backward = backward + self.distill_weight * distilled_backward
        return loss, backward

    def _distilled(
        self,
        anchors: torch.Tensor,
        positives: torch.Tensor,
        negatives: torch.Tensor,
        present: np.ndarray,
        teacher_scores: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distillation term over this worker's rows: the student's cosine of each anchor
        with its positive and its ``(n, m, d)`` mined ``negatives`` (``present``: ``(n, m)``)
        against the teacher's ``(n, 1 + m)`` scores of the same pairs."""
        anchors, positives, negatives = (F.normalize(x, dim=-1) for x in (anchors, positives, negatives))
        student = torch.cat(
            [(anchors * positives).sum(dim=-1, keepdim=True), torch.einsum("nd,nkd->nk", anchors, negatives)],
            dim=1,
        )
        slots = np.concatenate([np.ones((len(present), 1), dtype=bool), present], axis=1)
        teacher = to_device(np.where(slots, teacher_scores, 0.0).astype(np.float32), self.device)
        return distillation_loss(
            student, teacher, to_device(slots, self.device), kind=self.distill_loss,
            temperature=self.temperature, teacher_temperature=self.teacher_temperature,
        )  # fmt: skip


def known_positive_candidates(
    anchors: np.ndarray, positives: np.ndarray, negatives: np.ndarray, known_pairs: np.ndarray, base: int
) -> np.ndarray:
    """Which of a global batch's candidates are known positives of each row's anchor.

    Args:
        anchors, positives: ``(n,)`` the rows' anchor and positive texts (text-table positions).
        negatives: ``(n, m)`` each row's hard-negative texts, -1 where absent.
        known_pairs: sorted ``anchor * base + positive`` codes of every training row.
        base: more than the largest text position.

    Returns:
        ``(n, n + n*m)`` bool over :func:`~pipeline.training.losses.simcse_loss`'s candidates
        (the batch's positives, then its hard negatives row by row): True where the candidate
        is a known positive of row i's anchor (another row of the same anchor, or another
        row's negative that is a paraphrase of this anchor). Row i's own positive is left to
        the loss, which never masks it.
    """
    candidates = np.concatenate([positives, negatives.reshape(-1)])
    codes = anchors.astype(np.int64)[:, None] * base + candidates[None, :]
    return np.isin(codes, known_pairs) & (candidates >= 0)[None, :]
