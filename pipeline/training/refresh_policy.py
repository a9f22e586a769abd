"""When the plan is refreshed, and what an epoch boundary does with a refresh: decisions only.

No Ray, no torch.distributed and no clock here: the caller passes the times in and does the
talking (:mod:`pipeline.training.miner_client`, :mod:`pipeline.training.plan_broadcast`), so
every rule below can be tested on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import UnrecoverableError

if TYPE_CHECKING:
    from pipeline.config.schema import Config


@dataclass
class Boundary:
    """What happened at one epoch boundary."""

    wait_seconds: float = 0.0
    refresh_seconds: float = 0.0
    staleness_steps: int = 0
    late: bool = False
    """Async: a refresh was under way but not finished, so the current plan was kept."""
    churn: float | None = None
    """The adopted refresh's ``mining/churn``: the share of the rows' mined negatives (pairs)
    or of the plan (corpus) it changed since the last mining; None: no earlier mining."""


@dataclass(frozen=True)
class RefreshSettings:
    """The part of the config that the refresh decisions read."""

    epochs: int
    lead_steps: int
    """Steps before an epoch's end at which rank 0 snapshots the weights and submits the
    refresh: 0 for ``every_epoch`` (after the last step), ``mining.max_staleness_steps`` for
    ``every_epoch_async``."""
    waits: bool
    """What a boundary does with a refresh that has not finished: wait for it (``every_epoch``)
    or keep the current plan, reshuffled, and adopt the refresh's at a later boundary
    (``every_epoch_async``). The one rule in which the two modes differ."""
    timeout_s: float
    max_restarts: int
    """Times a dead miner is restarted (``train.max_failures``; -1: no limit)."""
    seed: int
    enabled: bool
    """Whether there is a miner to ask at all (``mining.refresh`` is not ``never``)."""
    at_boundaries: bool = True
    """Whether epoch boundaries ask it (``mining.refresh=every_epoch``); the pairs task's
    ``once`` mines before epoch 1 only."""
    before_training: bool = False
    """Pairs task: mine once with the starting model before epoch 1."""

    @classmethod
    def from_config(cls, cfg: Config) -> RefreshSettings:
        """The settings from ``cfg`` (``train.epochs``, ``run.seed`` and the ``mining`` section)."""
        return cls(
            epochs=cfg.train.epochs,
            lead_steps=cfg.mining.max_staleness_steps if cfg.refresh_mode == "async" else 0,
            waits=cfg.refresh_mode == "sync",
            timeout_s=cfg.mining.timeout_s,
            max_restarts=cfg.train.max_failures,
            seed=cfg.run.seed,
            enabled=cfg.mines,
            at_boundaries=cfg.refreshes_at_boundaries,
            before_training=cfg.mines_before_training,
        )


@dataclass(frozen=True)
class Pending:
    """A refresh submitted to the miner whose plan has not been adopted yet."""

    ticket: Any
    """What submitting returned (a Ray object ref); opaque here."""
    snapshot_step: int
    """The step whose weights the refresh mines from."""
    submitted_at: float
    """When it was submitted, on the clock the caller passes to :meth:`RefreshPolicy.boundary_action`."""


class BoundaryAction(enum.Enum):
    """What rank 0 does at a boundary that asks the miner."""

    WAIT = "wait"
    """``waits``: wait for the refresh's plan (submitting it now if it is not under way)."""
    ADOPT = "adopt"
    """Async: the refresh has finished: collect and adopt its plan."""
    LATE = "late"
    """Async: the refresh is still under way: keep the current plan, reshuffled; its plan is
    adopted at a later boundary."""
    RESHUFFLE = "reshuffle"
    """Async: no refresh under way (a run resumed at the boundary): keep the current plan, reshuffled."""


class RefreshPolicy:
    """The refresh rules for one rank: when to submit, and what each boundary does.

    Args:
        settings: see :class:`RefreshSettings`.
        rank: this worker's rank; only rank 0 submits and decides a boundary.

    Holds the one refresh under way (:attr:`pending`) from its submission until its plan is
    adopted; a refresh submitted again after a miner failure replaces it.
    """

    def __init__(self, settings: RefreshSettings, rank: int):
        self.settings = settings
        self.rank = rank
        self.pending: Pending | None = None
        self._submitted_in_epoch: int | None = None

    def _last_epoch(self, epoch: int) -> bool:
        return epoch + 1 >= self.settings.epochs

    def asks_miner(self, epoch: int) -> bool:
        """Whether the boundary after epoch ``epoch`` (0-based) gets its plan from the miner
        (and may wait): never after the last epoch, never without a miner, never when it mines
        only before training."""
        return self.settings.enabled and self.settings.at_boundaries and not self._last_epoch(epoch)

    def mines_before_training(self, step: int) -> bool:
        """Whether a run at ``step`` first asks the miner for negatives from the starting
        weights: the pairs task, a fresh run (a resumed one carries its plan in the checkpoint)."""
        return self.settings.enabled and self.settings.before_training and step == 0

    def submits_after_step(self, epoch: int, steps_done: int, num_batches: int) -> bool:
        """Whether rank 0 submits the refresh now, ``steps_done`` of the epoch's ``num_batches``
        steps in: once ``lead_steps`` remain (after the last step for a lead of 0; at once for
        a run resumed past that point), once per epoch, and not while a refresh is under way."""
        if self.rank != 0 or not self.asks_miner(epoch):
            return False
        if self.pending is not None or self._submitted_in_epoch == epoch:
            return False
        return steps_done >= max(0, num_batches - self.settings.lead_steps)

    def submitted(self, epoch: int, ticket: Any, step: int, now: float) -> None:
        """Record a refresh submitted in epoch ``epoch`` from the weights at ``step``, at time ``now``."""
        self.pending = Pending(ticket, step, now)
        self._submitted_in_epoch = epoch

    def boundary_action(self, now: float, finished: Callable[[Any], bool]) -> BoundaryAction:
        """Rank 0, at a boundary that :meth:`asks_miner`: what to do at time ``now``.

        ``finished(ticket)`` says whether the pending refresh is done; it is called only where
        the boundary does not wait and a refresh is under way.

        Raises:
            UnrecoverableError: the boundary does not wait, and the refresh under way was
                submitted more than ``mining.timeout_s`` ago.
        """
        if self.settings.waits:
            return BoundaryAction.WAIT
        if self.pending is None:
            return BoundaryAction.RESHUFFLE
        if finished(self.pending.ticket):
            return BoundaryAction.ADOPT
        if now - self.pending.submitted_at > self.settings.timeout_s:
            raise UnrecoverableError(
                f"the miner did not return a plan within mining.timeout_s={self.settings.timeout_s:g}s"
            )
        return BoundaryAction.LATE

    def adopted(self, step: int) -> int:
        """The pending refresh's plan is adopted at ``step``: forget the refresh and return its
        staleness, the steps between its weights and now (0 for a refresh submitted after the
        epoch's last step, or at the boundary itself)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return 0
        return step - pending.snapshot_step

    def reshuffle_seed(self, epoch: int) -> int:
        """The seed for the plan kept (reshuffled) after epoch ``epoch``: the same on every rank."""
        return self.settings.seed + epoch + 1
