"""Getting each epoch's batch plan (and, for pairs, the rows' negatives column) from the miner,
for every rank.

:class:`PlanRefresher` composes the three parts: the rules
(:mod:`pipeline.training.refresh_policy`), rank 0's calls to the miner
(:mod:`pipeline.training.miner_client`) and the plan's broadcast
(:mod:`pipeline.training.plan_broadcast`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from pipeline.batching.plan import PlanShare
from pipeline.config.schema import Config
from pipeline.core.errors import UnrecoverableError, actor_lost_errors, first_line
from pipeline.core.seams import ASYNC_BOUNDARIES_ENV, scripted_boundaries
from pipeline.model.encoder import SentenceEncoder
from pipeline.training.miner_client import MinerClient
from pipeline.training.plan_broadcast import broadcast_plan
from pipeline.training.plan_source import PlanInputs, PlanSource, share_of
from pipeline.training.refresh_policy import Boundary, BoundaryAction, RefreshPolicy, RefreshSettings
from pipeline.training.state import TrainState

__all__ = ["Adopted", "Boundary", "PlanRefresher"]

Adopted = tuple[PlanSource, PlanShare, Boundary]
"""What a boundary hands every rank: where the next plan comes from (the same on every rank),
this rank's share of it (its rows, with their negatives beside them), and what the boundary did."""


class PlanRefresher:
    """Gets each next epoch's plan from the miner (rank 0 talks to it) for every rank.

    Rank 0 snapshots the weights and submits the refresh a fixed number of steps before the
    epoch's end (``every_epoch``: after its last step, so the epoch-end evaluation overlaps the
    miner's work; ``every_epoch_async``: ``mining.max_staleness_steps`` before, and training
    goes on meanwhile). At the boundary a finished refresh's plan is adopted; one still
    running is waited for (``every_epoch``) or left for a later boundary while the current
    plan is kept, its batches reshuffled (``every_epoch_async``; its larger staleness is
    logged when it is adopted). Rank 0 broadcasts what it chose.

    A miner that dies during a refresh is restarted by Ray (``train.max_failures``); the
    refresh is then submitted again with the newest weights, and the event is logged.

    Args:
        cfg: the run's config.
        rank: this worker's rank; rank 0 talks to the miner.
        world: the number of workers.
        inputs: what every plan is made from (each rank's share is made by a Ray task:
            :func:`~pipeline.training.plan_source.share_of`).
        client: the connection to the miner actor (built on every rank, used by rank 0), or
            None when no miner runs: then every boundary reshuffles. The miner writes what
            each refresh mined to the run's storage and hands back its URI
            (:attr:`~pipeline.mining.refresh_report.RefreshReport.mined`), which is all rank 0
            receives and broadcasts of it.
    """

    def __init__(
        self,
        cfg: Config,
        rank: int,
        world: int,
        inputs: PlanInputs,
        client: MinerClient | None,
    ):
        self.cfg = cfg
        self.rank, self.world = rank, world
        self.inputs = inputs
        settings = RefreshSettings.from_config(cfg)
        if client is None:
            settings = dataclasses.replace(settings, enabled=False)  # no actor: nothing to ask
        self.policy = RefreshPolicy(settings, rank)
        self.client = client
        self._scripted = scripted_boundaries(os.environ.get(ASYNC_BOUNDARIES_ENV))

    def share(self, source: PlanSource) -> PlanShare:
        """This rank's share of the plan ``source`` names."""
        return share_of(source, self.inputs, world=self.world, rank=self.rank)

    @property
    def waits(self) -> bool:
        """Whether a boundary waits for an unfinished refresh (``every_epoch``)."""
        return self.policy.settings.waits

    @property
    def restarts(self) -> int:
        """Miner deaths survived so far in this run (``train.max_failures`` bounds them)."""
        return self.client.restarts if self.client is not None else 0

    @property
    def miner_pid(self) -> int | None:
        """The miner's process id when rank 0 last heard from it (None: no miner)."""
        return self.client.miner_pid if self.client is not None else None

    def asks_miner(self, epoch: int) -> bool:
        """Whether the boundary after epoch ``epoch`` gets its plan from the miner (and may wait)."""
        return self.policy.asks_miner(epoch)

    def mines_before_training(self, step: int) -> bool:
        """Whether a run at ``step`` first mines with the starting weights (the pairs task, fresh run)."""
        return self.policy.mines_before_training(step)

    def initial_plan(self, state: TrainState, model: SentenceEncoder) -> Adopted:
        """The pairs task, before epoch 1: the negatives mined with the starting weights, waited
        for in every ``mining.refresh`` mode (the static negatives sentence-transformers'
        ``mine_hard_negatives`` gives, and the baseline every refresh improves on), beside epoch
        1's rows in their order. The same on every rank."""
        assert state.source is not None and self.client is not None
        start = time.perf_counter()
        chosen = None
        if self.rank == 0:
            version = state.source.version + 1
            ref = self.client.submit(model, version, state.step)
            report = self.client.wait(ref, model, version, state.step)
            boundary = Boundary(refresh_seconds=float(report.metrics["mining/total_s"]))
            chosen = (
                dataclasses.replace(state.source, version=version, negatives=mined_uri(report)),
                boundary,
            )
        source, boundary = broadcast_plan(chosen, start)
        return source, self.share(source), boundary

    def _submit(self, epoch: int, model: SentenceEncoder, version: int, step: int) -> None:
        assert self.client is not None  # the policy submits only when there is a miner
        ref = self.client.submit(model, version, step)
        self.policy.submitted(epoch, ref, step, time.perf_counter())

    def after_step(
        self, epoch: int, steps_done: int, plan: PlanShare, step: int, model: SentenceEncoder
    ) -> None:
        """Submit the refresh once the policy's lead of steps remain in the epoch (at once
        when a run resumes past that point: a lost refresh is not waited for).

        Its plan becomes version ``plan.version + 1``: no other plan can be adopted before it.
        """
        if self.policy.submits_after_step(epoch, steps_done, plan.num_batches):
            self._submit(epoch, model, plan.version + 1, step)

    def next_plan(self, epoch: int, state: TrainState, model: SentenceEncoder) -> Adopted:
        """Where the plan for the epoch after ``epoch`` comes from (the same on every rank), this
        rank's share of it (its rows with their negatives) and what its boundary did
        (``state.source``: the finished epoch's plan's; ``state.step``: the step now)."""
        assert state.source is not None
        if not self.asks_miner(epoch):
            # No refresh: a reshuffled plan, named identically on every rank, no communication.
            source = self._reshuffled(state.source, epoch)
            return source, self.share(source), Boundary()
        start = time.perf_counter()
        chosen = self._choose_plan(epoch, state, model) if self.rank == 0 else None
        source, boundary = broadcast_plan(chosen, start)
        return source, self.share(source), boundary

    def drop_pending(self, version: int) -> None:
        """Rank 0, when the run ends with a refresh under way (``eval.patience`` stopped it
        after the refresh was submitted): let it finish, within ``mining.timeout_s``, and
        drop its plan (``version``, for the timeout's message). The miner then ends idle, and its last uploads are not stuck behind a
        refresh nobody will read. A miner that failed meanwhile is left alone: nothing waits
        for it any more."""
        pending = self.policy.pending
        if self.rank != 0 or pending is None or self.client is None:
            return
        try:
            self.client.get(pending.ticket, version, self.client.deadline())
        except (*actor_lost_errors(), UnrecoverableError) as exc:
            print(f"[mining] the dropped refresh did not finish: {first_line(exc)}", flush=True)
        self.policy.pending = None

    def _choose_plan(
        self, epoch: int, state: TrainState, model: SentenceEncoder
    ) -> tuple[PlanSource, Boundary]:
        """Rank 0: where the next plan comes from: what the miner returned if the policy
        adopts it now, else the current plan reshuffled with the current negatives."""
        current, step = state.source, state.step
        assert current is not None
        assert self.client is not None  # the policy asks only when there is a miner
        version = current.version + 1
        action = self.policy.boundary_action(time.perf_counter(), self._finished_predicate())
        report = None
        if action is BoundaryAction.WAIT:
            pending = self.policy.pending
            ref = pending.ticket if pending is not None else self.client.submit(model, version, step)
            report = self.client.wait(ref, model, version, step)
        elif action is BoundaryAction.ADOPT:
            assert self.policy.pending is not None
            report = self.client.collect(self.policy.pending.ticket, version, step)
            if report is None:
                # Async never waits for the plan: the new refresh's plan is adopted at the next boundary.
                self._submit(epoch, model, version, step)
        if report is None:
            late = action in (BoundaryAction.LATE, BoundaryAction.ADOPT)
            return self._reshuffled(current, epoch), Boundary(late=late)
        churn = report.metrics.get("mining/churn")
        boundary = Boundary(
            refresh_seconds=float(report.metrics["mining/total_s"]),
            staleness_steps=self.policy.adopted(step),
            churn=float(churn) if churn is not None else None,
        )
        if self.inputs.triplets_ref is not None:
            # Pairs: the new negatives travel beside the rows, which go into fresh random batches.
            reshuffled = self._reshuffled(current, epoch)
            return dataclasses.replace(reshuffled, version=version, negatives=mined_uri(report)), boundary
        return PlanSource(version, mined_plan=mined_uri(report)), boundary

    def _finished_predicate(self) -> Callable[[Any], bool]:
        """Whether a pending refresh counts as finished at this boundary: by the clock, or as
        a test scripts it (:mod:`pipeline.core.seams`: each boundary that asks takes the next
        word)."""
        assert self.client is not None
        client, scripted = self.client, self._scripted

        def finished(ticket: Any) -> bool:
            if not scripted:
                return client.finished(ticket)
            if scripted.pop(0) == "late":
                return False
            return client.finished(ticket, within_s=self.cfg.mining.timeout_s)

        return finished

    def _reshuffled(self, source: PlanSource, epoch: int) -> PlanSource:
        """The rows in fresh random batches (same version) where the plan's batches carry no
        structure: epoch 1's random plan, and every pairs plan (the same batches every epoch
        would repeat the same in-batch negatives); a mined corpus plan's same batches in a new
        order. The rows keep their negatives."""
        seed = self.policy.reshuffle_seed(epoch)
        if source.mined_plan is None:
            return dataclasses.replace(source, seed=seed)
        return dataclasses.replace(source, reorders=(*source.reorders, seed))


def mined_uri(report: Any) -> str:
    """Where the miner wrote what refresh ``report`` mined (a :class:`~pipeline.mining.refresh_report.
    RefreshReport`: the job gives the miner run storage)."""
    assert report.mined is not None, "the miner writes what it mines to run storage (MinerSettings.mined_dir)"
    return report.mined


def adopt_plan(state: TrainState, adopted: Adopted, logger: Any, *, refresh_waits: bool) -> Boundary:
    """Make the adopted plan (its source and this rank's share) the current one and record the boundary:
    its wait, refresh time and staleness in the history, and (rank 0's ``logger``) as
    ``mining/`` boundary metrics: the wait always, staleness and lateness only where a
    refresh does not wait (``refresh_waits`` false), since a waiting one is never stale or
    late and would chart a flat zero. Returns the boundary."""
    source, share, boundary = adopted
    state.history.wait_seconds.append(boundary.wait_seconds)
    state.history.refresh_seconds.append(boundary.refresh_seconds)
    state.history.staleness_steps.append(boundary.staleness_steps)
    state.source, state.plan, state.plan_pending = source, share, False
    if logger is not None:
        metrics = {"mining/refresh_wait_s": boundary.wait_seconds}
        if not refresh_waits:
            metrics["mining/next_plan_staleness_steps"] = float(boundary.staleness_steps)
            metrics["mining/refresh_late"] = float(boundary.late)
        logger.log(metrics, state.step)
        logger.flush()
    return boundary
