"""One SimCSE training step's forward pass and loss, on this worker's share of the global batch.

The strategy is chosen once, by :func:`make_train_step`:
:class:`~pipeline.training.unsupervised_step.UnsupervisedStep` (two dropout views of each
sentence) or :class:`~pipeline.training.triplet_step.TripletStep` (anchor, positive and the
given and mined negatives of each row). Both are called the same way (:class:`TrainStep`)
and return ``(loss, loss_to_backward)``; :class:`OptimizerStep` does the rest of the step:
backward, gradient clipping, the optimizer and the schedule.

No Ray here: ``bench.gpu_step`` times this same step on a machine without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.config.schema import Config
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.triplets import Triplets
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.masking import MaskingSpec
from pipeline.training.triplet_step import TripletStep
from pipeline.training.unsupervised_step import UnsupervisedStep


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
    cfg: Config,
    corpus: TokenizedCorpus,
    triplets: Triplets | None,
    device: torch.device,
    *,
    bf16: bool | None = None,
    masking: MaskingSpec | None = None,
) -> TrainStep:
    """The run's step: :class:`TripletStep` for ``task: pairs``,
    else :class:`UnsupervisedStep`; the other settings come from ``cfg.train``. ``bf16``: the
    forward passes under bf16 autocast; None (the job's choice): where ``device`` computes
    bf16 natively. Not a config key: the hardware decides, as it does for a GPU.
    ``masking``: the tokenizer's :class:`~pipeline.training.masking.MaskingSpec`, which
    ``train.mlm_weight`` > 0 needs.

    Raises:
        ValueError: the pairs task without triplets, or triplets for the corpus task.
    """
    if cfg.pairs:
        if triplets is None:
            raise ValueError("task: pairs needs the triplet rows")
        return TripletStep(
            corpus, triplets, cfg.train.temperature, cfg.train.hard_negative_weight, device,
            distill_weight=cfg.train.distill_weight, distill_loss=cfg.train.distill_loss,
            teacher_temperature=cfg.mining.teacher.temperature, bf16=bf16,
            hardness_strength=cfg.train.hardness_strength, directions=tuple(cfg.train.directions),
        )  # fmt: skip
    if triplets is not None:
        raise ValueError(f"triplet rows given, but task: {cfg.task}")
    if cfg.train.mlm_weight > 0 and masking is None:
        raise ValueError("train.mlm_weight needs the tokenizer's masking spec")
    return UnsupervisedStep(
        corpus, cfg.train.temperature, cfg.train.dup_rate, device, bf16=bf16,
        mlm_weight=cfg.train.mlm_weight, masking=masking, directions=tuple(cfg.train.directions),
    )  # fmt: skip


@dataclass(frozen=True)
class OptimizerStep:
    """What follows a step's loss: backward, gradient clipping, the optimizer and the
    schedule. A call runs the three stages, public so that ``bench.gpu_step`` can time them
    apart: :meth:`backward`, :meth:`clip`, :meth:`step`."""

    model: Any
    """Whose parameters are clipped: the encoder (not its DDP wrapper, whose parameters are
    the same tensors)."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    """The learning-rate schedule, stepped after every optimizer step."""
    max_grad_norm: float

    def __call__(self, loss_to_backward: torch.Tensor) -> None:
        self.backward(loss_to_backward)
        self.clip()
        self.step()

    def backward(self, loss_to_backward: torch.Tensor) -> None:
        """The gradient of ``loss_to_backward`` (:class:`TrainStep`'s), from zero."""
        self.optimizer.zero_grad(set_to_none=True)
        loss_to_backward.backward()

    def clip(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
