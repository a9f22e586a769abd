"""One SimCSE training step's forward pass and loss, on this worker's share of the global batch.

The strategy is chosen once, by :func:`make_train_step`: :class:`UnsupervisedStep` (two
dropout views of each sentence) or :class:`TripletStep` (anchor, positive and the given and
mined negatives of each row). Both are called the same way (:class:`TrainStep`) and return
``(loss, loss_to_backward)``; the backward pass and the optimizer stay with the caller.

No Ray here: ``bench/gpu_step.py`` times this same step on a machine without it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.batching.plan import BatchPlan, worker_slices
from pipeline.config.schema import Config
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.model.accel import autocast, to_device
from pipeline.training.augment import repeat_words
from pipeline.training.debias import false_negative_mask
from pipeline.training.losses import gather_across_workers, global_batch_simcse_loss, simcse_loss

__all__ = [
    "GlobalBatch",
    "TrainStep",
    "TripletStep",
    "UnsupervisedStep",
    "ViewBatch",
    "make_train_step",
    "two_views",
]


@dataclass(frozen=True)
class GlobalBatch:
    """One step's rows: the whole global batch, and which slice of it is this worker's."""

    rows: np.ndarray
    """``(sum(sizes),)`` training-row positions of the global batch, rank 0's rows first (a
    slice of the epoch's plan)."""
    sizes: Sequence[int]
    """Rows held by each rank (:func:`pipeline.batching.plan.worker_slices`)."""
    rank: int
    """This worker's rank: it trains on slice ``rank`` of ``rows``."""
    mined: np.ndarray | None = None
    """Triplet mode: the plan's ``(num_rows, num_negatives)`` mined negatives (-1 where none),
    or None before the first refresh; unused otherwise."""
    false_negative_mask: np.ndarray | None = None
    """Unsupervised mode with ``mining.debias``: ``(sum(sizes), sum(sizes))`` bool over
    :attr:`rows`, True at (i, j) when row j is a likely false negative of row i
    (:func:`pipeline.training.debias.false_negative_mask`, the same on every rank); None: no
    debiasing. Triplet mode ignores it."""

    @classmethod
    def of_plan(cls, plan: BatchPlan, batch_index: int, world: int, rank: int, debias: str) -> GlobalBatch:
        """Batch ``batch_index`` of ``plan`` as rank ``rank`` of ``world`` trains it. Every rank
        holds the same plan, so every rank builds the same mask of the global batch (None on
        epoch 1's random plan, or without ``mining.debias``)."""
        rows = plan.batch(batch_index)
        mask = false_negative_mask(rows, plan, debias)
        return cls(rows, worker_slices(len(rows), world), rank, plan.negatives, mask)

    @property
    def local_rows(self) -> np.ndarray:
        """This worker's contiguous slice of :attr:`rows` (``sizes[rank]`` rows)."""
        lo = sum(self.sizes[: self.rank])
        return self.rows[lo : lo + self.sizes[self.rank]]


class TrainStep(Protocol):
    """One step's forward pass and loss on this worker's share of a global batch."""

    def __call__(
        self, model: Any, batch: GlobalBatch, augment_rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of one global batch, computed from this worker's rows.

        Args:
            model: the encoder, or its DDP wrapper: ``model(input_ids, attention_mask)`` gives
                ``(rows, d)`` embeddings.
            batch: the global batch and this worker's slice of it.
            augment_rng: the epoch's augmentation generator (word repetition draws from it).

        Returns:
            ``(loss, loss_to_backward)``: the global-batch loss (the same value on every rank),
            and what to call ``backward()`` on, whose DDP-averaged gradient is the gradient of
            one process computing ``loss`` on the whole global batch.
        """
        ...


def make_train_step(
    cfg: Config, corpus: TokenizedCorpus, triplets: Triplets | None, device: torch.device
) -> TrainStep:
    """The run's step: :class:`TripletStep` when ``mining.negative_mode`` is ``triplet``,
    else :class:`UnsupervisedStep`; the other settings come from ``cfg.train`` (and the
    false-negative weight from ``cfg.mining.debias_weight``).

    Raises:
        ValueError: triplet mode without triplets, or triplets in another mode.
    """
    if cfg.mining.negative_mode == "triplet":
        if triplets is None:
            raise ValueError("mining.negative_mode=triplet needs the triplet rows")
        return TripletStep(corpus, triplets, cfg.train.temperature, cfg.train.hard_negative_weight, device)
    if triplets is not None:
        raise ValueError(f"triplet rows given, but mining.negative_mode={cfg.mining.negative_mode!r}")
    return UnsupervisedStep(
        corpus,
        cfg.train.temperature,
        cfg.train.dup_rate,
        device,
        false_negative_weight=cfg.mining.debias_weight,
    )


@dataclass
class ViewBatch:
    """The host arrays of one worker's unsupervised step (:meth:`UnsupervisedStep.collate`)."""

    input_ids: np.ndarray
    """``(2n, width)`` int64: this worker's n rows, then their second view, right-padded."""
    attention_mask: np.ndarray
    """``(2n, width)`` int64, 1 for real tokens."""
    global_ids: np.ndarray
    """``(sum(sizes),)`` corpus ids of the whole global batch, rank order: rows sharing one
    are not each other's negatives."""
    false_negative_mask: np.ndarray | None = None
    """``(sum(sizes), sum(sizes))`` bool: the global batch's likely false negatives
    (:attr:`GlobalBatch.false_negative_mask`), or None."""


@dataclass(frozen=True)
class UnsupervisedStep:
    """Unsupervised SimCSE: each sentence's two dropout views (the second with ESimCSE word
    repetition when ``dup_rate > 0``) are positives; every other sentence of the global
    batch is a negative, except the likely false negatives a batch's
    :attr:`GlobalBatch.false_negative_mask` flags (``mining.debias``), whose weight in the
    softmax is ``false_negative_weight``.

    A call runs four stages, public so that ``bench/gpu_step.py`` can time them apart:
    :meth:`collate` (host), :meth:`upload` (host to device, with :meth:`upload_mask`),
    :meth:`forward`, :meth:`loss`.
    """

    corpus: TokenizedCorpus
    temperature: float
    dup_rate: float
    """ESimCSE word repetition rate of the second view (0: none)."""
    device: torch.device
    false_negative_weight: float = 0.0
    """``mining.debias_weight``: a flagged candidate's weight in the anchor's softmax (0
    removes it); unused for batches without a mask."""

    def __call__(
        self, model: Any, batch: GlobalBatch, augment_rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`TrainStep`."""
        return self.on_device(model, self.collate(batch, augment_rng), batch.sizes)

    def collate(self, batch: GlobalBatch, augment_rng: np.random.Generator) -> ViewBatch:
        """This worker's rows as both views (:func:`two_views`), and the global batch's ids and
        false-negative mask."""
        input_ids, mask = two_views(self.corpus, batch.local_rows, self.dup_rate, augment_rng)
        return ViewBatch(input_ids, mask, self.corpus.ids[batch.rows], batch.false_negative_mask)

    def on_device(
        self, model: Any, batch: ViewBatch, sizes: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`upload`, :meth:`forward` and :meth:`loss` of a collated batch."""
        input_ids, mask, global_ids = self.upload(batch)
        false_negatives = self.upload_mask(batch)
        view1, view2 = self.forward(model, input_ids, mask)
        return self.loss(view1, view2, global_ids, sizes, false_negatives)

    def upload(self, batch: ViewBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask, global_ids)`` on the device (asynchronous on CUDA)."""
        return (
            to_device(batch.input_ids, self.device),
            to_device(batch.attention_mask, self.device),
            to_device(batch.global_ids, self.device),
        )

    def upload_mask(self, batch: ViewBatch) -> torch.Tensor | None:
        """The batch's ``(b, b)`` bool false-negative mask on the device (asynchronous on
        CUDA), or None. Apart from :meth:`upload`, whose three tensors every batch has."""
        if batch.false_negative_mask is None:
            return None
        return to_device(batch.false_negative_mask, self.device)

    def forward(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both views in one forward pass (the batch twice, stacked), under autocast.

        Returns:
            ``(view1, view2)``, each ``(n, d)`` fp32.
        """
        with autocast(self.device):
            embeddings = model(input_ids, attention_mask)
        return embeddings.float().split(input_ids.shape[0] // 2)

    def loss(
        self,
        view1: torch.Tensor,
        view2: torch.Tensor,
        global_ids: torch.Tensor,
        sizes: Sequence[int],
        false_negative_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`pipeline.training.losses.global_batch_simcse_loss` over every worker's views.

        Args:
            view1, view2: ``(sizes[rank], d)`` this worker's two views.
            global_ids: ``(sum(sizes),)`` corpus ids of the global batch.
            sizes: rows per rank.
            false_negative_mask: optional ``(sum(sizes), sum(sizes))`` bool, the global
                batch's likely false negatives (weighted by :attr:`false_negative_weight`).

        Returns:
            ``(loss, loss_to_backward)``, as :class:`TrainStep`.
        """
        return global_batch_simcse_loss(
            view1,
            view2,
            list(sizes),
            global_ids,
            self.temperature,
            false_negative_mask=false_negative_mask,
            false_negative_weight=self.false_negative_weight,
        )


@dataclass(frozen=True)
class TripletStep:
    """Supervised SimCSE on triplet rows, negatives gathered from all workers.

    Each row's negatives are its given one (if any) and its mined ones (if a refresh has
    happened): ``1 + num_negatives`` slots, absent ones masked. Anchors, positives and the
    present negatives go through the encoder in one forward pass. Rows sharing a positive
    text (a premise with several hypotheses) are not each other's negatives, and neither are
    rows sharing an anchor text (a headline with several paraphrases: each row's positive is
    a known positive of the other's anchor). In-batch false-negative debiasing does not apply
    (the config allows ``mining.debias`` only in neighbourhood mode):
    :attr:`GlobalBatch.false_negative_mask` is ignored.
    """

    corpus: TokenizedCorpus
    triplets: Triplets
    temperature: float
    hard_negative_weight: float
    """Added to the logit of each row's own hard negatives (SimCSE's supervised weight)."""
    device: torch.device

    @functools.cached_property
    def _known_pairs(self) -> tuple[np.ndarray, int]:
        """Every training row's (anchor, positive) as sorted codes, and the code base."""
        base = len(self.corpus.ids) + 1
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
        """See :class:`TrainStep`; ``batch.rows`` are triplet rows, ``augment_rng`` is unused."""
        local_rows, sizes = batch.local_rows, list(batch.sizes)
        triplets, device = self.triplets, self.device
        negatives = triplets.negative[local_rows][:, None]
        if batch.mined is not None:
            negatives = np.concatenate([negatives, batch.mined[local_rows]], axis=1)
        present = negatives >= 0
        global_negatives = triplets.negative[batch.rows][:, None]
        if batch.mined is not None:
            global_negatives = np.concatenate([global_negatives, batch.mined[batch.rows]], axis=1)
        texts = np.concatenate(
            [triplets.anchor[local_rows], triplets.positive[local_rows], negatives[present]]
        )
        input_ids, mask = self.corpus.batch(texts)
        with autocast(device):
            embeddings = model(to_device(input_ids, device), to_device(mask, device)).float()
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
            row_ids=to_device(self.corpus.ids[triplets.positive[batch.rows]], device),
            hard_negative_mask=gather_across_workers(present_t.float(), sizes) > 0.5,
            false_negative_mask=to_device(
                self.known_positive_candidates(batch.rows, global_negatives), device
            ),
        )
        # Every rank backpropagates through its own rows only; DDP averages over the ranks.
        return loss, loss * len(sizes)


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
