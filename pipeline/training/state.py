"""Everything besides the weights that a resumed run needs (:class:`TrainState`), and what
the run has done so far (:class:`TrainHistory`).

Both are turned into plain data in exactly one place, :meth:`TrainState.to_dict` /
:meth:`TrainState.from_dict` (the checkpoint's ``train_state.pt``, read back with
``weights_only=True``) and :meth:`TrainHistory.to_dict` / :meth:`TrainHistory.from_dict`
(also what each ``ray.train.report`` carries to the driver, which builds the job summary
from it). A new history field is declared once, in :class:`TrainHistory`.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.batching.plan import PlanShare
from pipeline.training.plan_source import PlanSource


@dataclass
class BestModel:
    """The evaluation that scored highest so far."""

    score: float
    epoch: float
    """Fractional for an evaluation inside an epoch (``eval.every_steps``)."""
    step: int


@dataclass
class TrainHistory:
    """What the run has done: one entry per completed epoch, epoch boundary or evaluation.

    Saved in every checkpoint, reported to Ray Train with it, and read back by the driver,
    whose summary is built from it alone.
    """

    epoch_losses: list[float] = field(default_factory=list)
    """Mean step loss of each completed epoch."""
    plan_versions: list[int] = field(default_factory=list)
    """Version of the plan each completed epoch trained on (0: random batches)."""
    wait_seconds: list[float] = field(default_factory=list)
    """Per epoch boundary: how long training waited for the next plan."""
    refresh_seconds: list[float] = field(default_factory=list)
    """Per epoch boundary: the miner's time for the plan adopted there (0 if none)."""
    staleness_steps: list[int] = field(default_factory=list)
    """Per epoch boundary: steps between the weights snapshot and the adopted plan's first use."""
    evaluations: list[dict[str, float]] = field(default_factory=list)
    """One entry per evaluation (``epoch``, ``step`` and the STS metrics); epoch 0 is the start model."""
    best: BestModel | None = None
    """The evaluation the exported model comes from (never the starting model)."""
    miner_restarts: int = 0
    """Times the miner actor died and was restarted."""
    miner_seen: list[str | int] | None = None
    """``[Ray job id, process id]`` of the miner when rank 0 last heard from it: within the same
    job, a new process id means Ray restarted the miner (a resumed job has a new miner)."""
    stopped_early: bool = False
    """``eval.patience`` ended the run before ``train.epochs``."""

    def evaluations_since_best(self) -> int:
        """Evaluations after the best one (all of them after the start while none is best):
        what ``eval.patience`` counts."""
        trained = [e for e in self.evaluations if e["epoch"] > 0]
        if self.best is None:
            return len(trained)
        return sum(1 for e in trained if e["step"] > self.best.step)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, numbers and dicts (for ``torch.save`` and ``ray.train.report``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainHistory:
        """The inverse of :meth:`to_dict`."""
        values = dict(saved)
        best = values.pop("best", None)
        history = cls(**{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()})
        history.best = BestModel(**best) if best is not None else None
        return history


@dataclass
class TrainState:
    """Where training is and what it has done: everything besides the weights, optimizer and
    scheduler that a resumed run needs to continue exactly."""

    epoch: int = 0
    """Epochs completed."""
    batches_done: int = 0
    """Batches of the epoch in progress (``epoch + 1``) already trained; 0 at a boundary."""
    step: int = 0
    source: PlanSource | None = None
    """Where the plan of the epoch in progress comes from (of the next one at a boundary, the
    finished epoch's own while ``plan_pending``): a seed, or what the miner returned. What a
    checkpoint keeps of the plan: every rank makes its share again from it."""
    plan: PlanShare | None = None
    """This rank's share of that plan (its rows, with their mined negatives beside them);
    made from :attr:`source` (:func:`~pipeline.training.plan_source.share_of`), never saved."""
    plan_pending: bool = False
    """At a boundary: checkpointed before the miner's plan for the next epoch came back, so a
    run resumed here asks the miner again."""
    history: TrainHistory = field(default_factory=TrainHistory)
    loss_sum: float = 0.0
    """Sum of the epoch in progress' step losses so far (its mean is the epoch loss)."""
    epoch_seconds: float = 0.0
    """Training time of the epoch in progress so far (across restarts)."""
    unsent_metrics: list[tuple[str, float, int, int]] = field(default_factory=list)
    """Rank 0's metrics MLflow had not taken yet (``(key, value, timestamp ms, step)``); the
    run that resumes from the checkpoint sends them."""
    rng: list[dict[str, Any]] | None = None
    """Per rank: torch (and CUDA), Python and word-repetition generator states, captured at
    the checkpoint. None at an epoch boundary, where each epoch reseeds from (seed, rank, epoch)."""

    def to_dict(self) -> dict[str, Any]:
        """The state as tensors, numbers, lists and dicts: loadable with ``weights_only=True``."""
        assert self.source is not None
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "step": self.step,
            "source": self.source.to_dict(),
            "plan_pending": self.plan_pending,
            "history": self.history.to_dict(),
            "loss_sum": self.loss_sum,
            "epoch_seconds": self.epoch_seconds,
            "unsent_metrics": self.unsent_metrics,
            "rng": self.rng,
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainState:
        """The inverse of :meth:`to_dict` (without :attr:`plan`, which the rank makes again).

        Raises:
            ValueError: a checkpoint of an earlier version, which kept the plan's arrays.
        """
        if "source" not in saved:
            raise ValueError(
                "this checkpoint was written by an earlier version (it holds the plan's arrays, "
                "not where the plan comes from): start the run under a new run.name"
            )
        return cls(
            epoch=saved["epoch"],
            batches_done=saved["batches_done"],
            step=saved["step"],
            source=PlanSource.from_dict(saved["source"]),
            plan_pending=bool(saved["plan_pending"]),
            history=TrainHistory.from_dict(saved["history"]),
            loss_sum=saved["loss_sum"],
            epoch_seconds=saved["epoch_seconds"],
            unsent_metrics=[tuple(m) for m in saved["unsent_metrics"]],
            rng=saved["rng"],
        )


def capture_rng(augment_rng: np.random.Generator) -> dict[str, Any]:
    """This process' random states: dropout (torch), Python's, and the augmentation generator."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "augment": augment_rng.bit_generator.state,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any], augment_rng: np.random.Generator) -> None:
    """Put back what :func:`capture_rng` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    augment_rng.bit_generator.state = state["augment"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
