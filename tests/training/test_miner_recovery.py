"""How rank 0 tells a miner that died (Ray restarted it: a new process) from one that only did
not answer (same process: not a restart), against a real Ray actor."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from pipeline.config.loading import load_config
from pipeline.core.errors import UnrecoverableError
from pipeline.core.retry import call_with_retries
from pipeline.training.miner_client import MinerClient
from pipeline.training.refresh_policy import RefreshSettings


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _client(ray, miner, pid, timeout_s=20.0):
    cfg = load_config(None, [f"mining.timeout_s={timeout_s}", "train.max_failures=1"])
    return MinerClient(miner, RefreshSettings.from_config(cfg), miner_pid=pid)


def test_unresponsive_miner_keeps_its_deadline_and_a_restarted_one_is_counted(ray_local, capsys):
    ray = ray_local

    class PidActor:  # local: pickled by value, since workers cannot import test modules
        """Answers ``ready()`` as the miner does: with its process id."""

        def ready(self, inputs: list) -> int:
            return os.getpid()

    miner = ray.remote(max_restarts=1)(PidActor).remote()
    pid = ray.get(miner.ready.remote([]))
    lost_call = ray.exceptions.ActorUnavailableError("RPC timed out", None)

    # Same process answers again: not a death, the refresh keeps its deadline.
    client = _client(ray, miner, pid)
    deadline = time.monotonic() + 20
    assert client.recover(lost_call, version=1, step=5, deadline=deadline) == deadline
    assert client.restarts == 0
    assert "[mining] the miner did not answer during refresh v1" in capsys.readouterr().out

    # The miner answered, with an actor error of what it asked (a shard of it that was lost):
    # the same process, asked again; the line names what failed under it.
    class Asker:
        def ask(self, other) -> int:
            return ray.get(other.ready.remote([]))

    gone = ray.remote(max_restarts=0)(PidActor).remote()
    ray.kill(gone, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError) as failed:
        ray.get(ray.remote(Asker).remote().ask.remote(gone))
    assert isinstance(failed.value, ray.exceptions.RayTaskError)
    # A deadline of its own, set after the actors above started (however slowly), and far off:
    # what is asserted is that it is kept, not how soon the miner answers.
    answered_deadline = time.monotonic() + 600
    assert client.recover(failed.value, version=1, step=5, deadline=answered_deadline) == answered_deadline
    assert client.restarts == 0
    out = capsys.readouterr().out
    assert "[mining] refresh v1 failed in the miner (" in out and "ray::" not in out

    # Killed and restarted by Ray: a new process id, counted, and a fresh mining.timeout_s.
    os.kill(pid, signal.SIGKILL)
    while not _gone(pid):
        time.sleep(0.05)
    died = ray.exceptions.ActorDiedError()
    new_deadline = client.recover(died, version=1, step=5, deadline=time.monotonic() + 20)
    assert client.restarts == 1 and client.miner_pid not in (None, pid)
    assert new_deadline > deadline
    assert "the miner actor died during refresh v1" in capsys.readouterr().out

    # Dead for good (its restarts used up): one line that says so. ray.kill returns before the
    # process is gone; a ready() sent before then would still be answered.
    restarted = client.miner_pid
    ray.kill(miner, no_restart=True)
    while not _gone(restarted):
        time.sleep(0.05)
    with pytest.raises(UnrecoverableError, match=r"train\.max_failures=1 restarts are used up"):
        client.recover(died, version=2, step=9, deadline=time.monotonic() + 20)


def test_a_miner_that_never_answers_ends_at_the_deadline(ray_local):
    ray = ray_local

    class Frozen:
        def ready(self, inputs: list) -> int:
            time.sleep(600)
            return os.getpid()

    miner = ray.remote(Frozen).remote()
    client = _client(ray, miner, pid=1, timeout_s=3)
    started = time.monotonic()
    with pytest.raises(
        UnrecoverableError, match=r"^the miner did not return plan v1 within mining\.timeout_s=3s$"
    ):
        client.recover(ray.exceptions.ActorUnavailableError("x", None), 1, 0, time.monotonic() + 3)
    assert time.monotonic() - started < 300  # at the 3 s deadline, not when the actor answers (600 s)
    ray.kill(miner)


def test_a_miner_that_died_between_refreshes_is_counted_when_its_successor_answers(ray_local, capsys):
    """The miner's node lost while it was idle: no call failed, but the next refresh comes back
    from a new process. Rank 0 counts that restart (and logs it); the report is used as it is."""
    ray = ray_local

    class Miner:
        """Answers ``refresh`` with a report of its process id, as the miner's does."""

        def refresh(self, inputs: list, weights, version: int, step: int):
            from pipeline.mining.refresh_report import RefreshReport

            return RefreshReport(version=version, metrics={}, miner_pid=os.getpid())

        def ready(self, inputs: list) -> int:
            return os.getpid()

    miner = ray.remote(max_restarts=1)(Miner).remote()
    first = ray.get(miner.refresh.remote([], None, 1, 0))
    client = _client(ray, miner, first.miner_pid)
    assert client.wait(miner.refresh.remote([], None, 1, 5), model=None, version=1, step=5) is not None
    assert client.restarts == 0 and capsys.readouterr().out == ""

    os.kill(first.miner_pid, signal.SIGKILL)  # between refreshes: nothing is waiting on it
    while not _gone(first.miner_pid):
        time.sleep(0.05)
    # Ray restarts it before the next refresh is sent (a call sent while it restarts fails,
    # and is the case above: a death during a refresh).
    call_with_retries(  # 300 s: a bound against a hang, not a timing branch
        lambda: ray.get(miner.ready.remote([]), timeout=10),
        retry_on=(ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError),
        timeout_s=300,
        wait_s=0.2,
    )
    report = client.wait(miner.refresh.remote([], None, 2, 25), model=None, version=2, step=25)
    assert report.miner_pid != first.miner_pid and client.miner_pid == report.miner_pid
    assert client.restarts == 1
    assert (
        "[mining] the miner actor died between refreshes (refresh v2 came from a new process); restart 1/1"
        in capsys.readouterr().out
    )
    ray.kill(miner)
