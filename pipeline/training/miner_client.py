"""Rank 0's calls to the miner actor: submit a refresh, get its plan by a deadline, and find
the miner again after it failed."""

from __future__ import annotations

import time
from typing import Any

import ray

from pipeline.core.errors import UnrecoverableError, actor_lost_errors, first_line
from pipeline.core.retry import call_with_retries
from pipeline.model.encoder import SentenceEncoder, cpu_state_dict
from pipeline.training.refresh_policy import RefreshSettings


class MinerClient:
    """Talks to the miner actor for rank 0.

    Args:
        miner: the miner actor's handle.
        settings: ``mining.timeout_s`` and the miner's restart budget (``train.max_failures``)
            are read.
        logger: rank 0's metric logger (or None): restarts are logged as ``mining/miner_restarts``.
        restarts: miner restarts already survived (by the run this one resumes).
        miner_pid: the miner's process id when last seen, if known.
        inputs: what every call to the actor brings (:func:`pipeline.training.contract.miner_inputs`);
            a restarted miner loads itself from them.
    """

    def __init__(
        self,
        miner: Any,
        settings: RefreshSettings,
        *,
        logger: Any = None,
        restarts: int = 0,
        miner_pid: int | None = None,
        inputs: list[Any] | None = None,
    ):
        self.miner = miner
        self.inputs = inputs or []
        self.settings = settings
        self.logger = logger
        self.restarts = restarts
        """Miner deaths survived so far in this run (``train.max_failures`` bounds them)."""
        self.miner_pid = miner_pid
        """The miner's process id when last seen (its ``ready()``): a new one means Ray restarted it."""

    def deadline(self) -> float:
        """A ``time.monotonic()`` deadline ``mining.timeout_s`` from now."""
        return time.monotonic() + self.settings.timeout_s

    def submit(self, model: SentenceEncoder, version: int, step: int) -> Any:
        """Start a refresh from ``model``'s current encoder weights; returns the Ray ref of its
        report, whose plan becomes version ``version`` (``step``: the weights' step)."""
        return self.miner.refresh.remote(self.inputs, ray.put(cpu_state_dict(model.encoder)), version, step)

    def finished(self, ref: Any, within_s: float = 0.0) -> bool:
        """Whether the refresh behind ``ref`` has finished (or failed), waiting at most
        ``within_s`` seconds for it (by default not at all)."""
        return bool(ray.wait([ref], timeout=within_s)[0])

    def _timed_out(self, version: int) -> UnrecoverableError:
        return UnrecoverableError(
            f"the miner did not return plan v{version} within mining.timeout_s={self.settings.timeout_s:g}s"
        )

    def get(self, ref: Any, version: int, deadline: float) -> Any:
        """The refresh report behind ``ref``, waited for until ``deadline`` (``time.monotonic()``).

        Raises:
            UnrecoverableError: the deadline passed.
            ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError: the miner failed during
                the refresh (see :meth:`recover`; :func:`~pipeline.core.errors.actor_lost_errors`).
        """
        try:
            return ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            raise self._timed_out(version) from None

    def _answered(self, report: Any, version: int, step: int) -> Any:
        """``report``, once its miner's process id is noted: a new one means the miner died after
        its last answer (between refreshes, e.g. with its node) and Ray restarted it before it
        mined this refresh, which is whole. Counted and reported as a restart."""
        pid = getattr(report, "miner_pid", None)
        if pid is not None and self.miner_pid is not None and pid != self.miner_pid:
            self._restarted(
                pid,
                step,
                f"[mining] the miner actor died between refreshes (refresh v{version} came from a new process)",
            )
        self.miner_pid = pid or self.miner_pid
        return report

    def wait(self, ref: Any, model: SentenceEncoder, version: int, step: int) -> Any:
        """Sync: the report behind ``ref``, within ``mining.timeout_s``; a miner that failed is
        waited for and the refresh submitted again from ``model`` (weights of ``step``)."""
        deadline = self.deadline()
        while True:
            try:
                return self._answered(self.get(ref, version, deadline), version, step)
            except actor_lost_errors() as exc:
                deadline = self.recover(exc, version, step, deadline)
                ref = self.submit(model, version, step)

    def collect(self, ref: Any, version: int, step: int) -> Any | None:
        """Async: the report behind the finished ``ref``; None when the miner failed during the
        refresh, once it answers again (the caller submits the refresh again)."""
        try:
            return self._answered(self.get(ref, version, self.deadline()), version, step)
        except actor_lost_errors() as exc:
            self.recover(exc, version, step, self.deadline())
            return None

    def _ask_ready(self, version: int, deadline: float) -> int:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timed_out(version)
        return ray.get(self.miner.ready.remote(self.inputs), timeout=remaining)

    def recover(self, exc: BaseException, version: int, step: int, deadline: float) -> float:
        """A refresh call failed on the actor (``exc``): wait until the miner answers again and
        return the deadline for the refresh that the caller submits again (from the newest
        weights, those of ``step``).

        Ray reports both a miner that died and one that did not answer in time (frozen, or
        starved of CPU on a loaded machine) as actor errors; the miner's process id tells
        them apart. Only a new process, Ray's restart of a dead miner, counts against
        ``train.max_failures`` and gets a fresh ``mining.timeout_s``; an unresponsive one
        keeps ``deadline``, the one the refresh already had. So does a miner that answered
        with an actor error of what it asked (a shard of it that was lost: the refresh
        submitted again replaces the shard).

        Raises:
            UnrecoverableError: the deadline passed, or the miner is dead for good.
        """
        reason = first_line(exc)
        if deadline - time.monotonic() <= 0:
            raise self._timed_out(version)
        try:
            # Calls made while Ray restarts the actor fail at once (max_task_retries=0): ask
            # again until it answers, it is dead for good, or the deadline passes.
            pid = call_with_retries(
                lambda: self._ask_ready(version, deadline),
                retry_on=ray.exceptions.ActorUnavailableError,
                timeout_s=deadline - time.monotonic(),
                wait_s=0.5,
            )
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            raise self._timed_out(version) from None
        except ray.exceptions.RayActorError as dead:
            # Ray restarts the actor train.max_failures times; after that it stays dead.
            raise UnrecoverableError(
                f"the miner actor died during refresh v{version} and train.max_failures="
                f"{self.settings.max_restarts} restarts are used up: {reason}"
            ) from dead
        if pid == self.miner_pid:
            if isinstance(exc, ray.exceptions.RayTaskError):
                # It answered, with what failed under it (a shard of it that was lost).
                print(f"[mining] refresh v{version} failed in the miner ({reason}); asking again", flush=True)
            else:
                print(
                    f"[mining] the miner did not answer during refresh v{version} ({reason}); asking again",
                    flush=True,
                )
            return deadline
        self._restarted(
            pid, step, f"[mining] the miner actor died during refresh v{version} ({reason})",
            f", re-mining from the weights at step {step}",
        )  # fmt: skip
        return self.deadline()

    def _restarted(self, pid: int, step: int, what: str, then: str = "") -> None:
        """Count and report (``what`` happened, ``then`` what follows) Ray's restart of the
        miner, now process ``pid``; logged at ``step``."""
        self.miner_pid = pid
        self.restarts += 1
        budget = "no limit" if self.settings.max_restarts < 0 else self.settings.max_restarts
        print(f"{what}; restart {self.restarts}/{budget}{then}", flush=True)
        if self.logger is not None:
            self.logger.log({"mining/miner_restarts": float(self.restarts)}, step)
            self.logger.flush()
