"""The test seams themselves: what reaches the job's actors, and what a hold leaves for the
test that kills the held process."""

from __future__ import annotations

import os
import threading

from bench.running_job import held_pid, wait_for
from pipeline.core.seams import (
    ACTOR_SEAMS,
    ASYNC_BOUNDARIES_ENV,
    CONNECT_TIMEOUT_ENV,
    HOLD_DIR_ENV,
    HOLD_ENV,
    actor_runtime_env,
    hold_once,
)


def test_the_actor_seams_set_travel_in_the_runtime_env_and_none_set_means_none(monkeypatch):
    for name in (*ACTOR_SEAMS, CONNECT_TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    # No seam: the actors start as they would without the module (no runtime_env of their own).
    assert actor_runtime_env() == {}
    monkeypatch.setenv(HOLD_ENV, "train_step=3")
    monkeypatch.setenv(HOLD_DIR_ENV, "/holds")
    monkeypatch.setenv(ASYNC_BOUNDARIES_ENV, "")  # set but empty: not a seam
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2")  # the driver's own
    assert actor_runtime_env() == {"env_vars": {HOLD_ENV: "train_step=3", HOLD_DIR_ENV: "/holds"}}


def test_a_hold_writes_the_holding_pid_blocks_until_released_and_holds_once(tmp_path, monkeypatch):
    monkeypatch.setenv(HOLD_ENV, "miner_refresh=2")
    monkeypatch.setenv(HOLD_DIR_ENV, str(tmp_path))
    held, release = tmp_path / "miner_refresh=2.held", tmp_path / "miner_refresh=2.release"
    hold_once("miner_refresh", 1)  # another point: returns at once
    assert not held.exists()

    holder = threading.Thread(target=hold_once, args=("miner_refresh", 2), daemon=True)
    holder.start()
    assert wait_for(lambda: held_pid(tmp_path, "miner_refresh=2"), 30, "the hold's file") == os.getpid()
    assert holder.is_alive()  # blocked until released
    release.touch()
    holder.join(timeout=30)
    assert not holder.is_alive()
    hold_once("miner_refresh", 2)  # held once already: a restarted process goes on
