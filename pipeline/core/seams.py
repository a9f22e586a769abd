"""Test seams: the places where a test makes a timing-dependent branch happen on purpose, or
shortens a fixed wait it would otherwise sit out.

Whether an async refresh is ready at a boundary, or where exactly a worker is when it is
killed, is otherwise a matter of how fast the machine is. A test that checks such a branch
sets one of the variables below in the job's environment; the job passes those its actors
read (Ray Train's workers, the miner) on to them in their ``runtime_env``
(:func:`actor_runtime_env`), so they arrive on a Ray that was already running too. A run
without them behaves as if this module did not exist.

``SIMCSE_TEST_ASYNC_BOUNDARIES``
    One word per async boundary that finds a refresh under way, in order: ``ready`` (rank 0
    waits for the refresh to finish, up to ``mining.timeout_s``, and adopts it) or ``late``
    (treated as unfinished, whatever it is). Later boundaries use the clock.
``SIMCSE_TEST_HOLD`` and ``SIMCSE_TEST_HOLD_DIR``
    ``point=key`` items, comma separated (``train_step=36,miner_refresh=1``): the process that
    reaches that point writes ``<point>=<key>.held`` (holding its process id) into the folder
    and blocks there until a
    ``<point>=<key>.release`` file appears (or it is killed: what a fault test does). It holds
    once per run: a restarted process finds the ``.held`` file and goes on.
``SIMCSE_TEST_RAY_START_TIMEOUTS``
    How many of the job's first starts of its own local Ray end as Ray's own "node timed out
    during startup" does (after Ray really started, so that the retry's cleanup runs): what a
    loaded machine makes happen by chance (:func:`pipeline.runtime.cluster.start_local_ray`).
``SIMCSE_TEST_CONNECT_TIMEOUT_S``
    Seconds the job's start waits for an HTTP tracking server and for a Ray cluster to
    answer, in place of the fixed :data:`pipeline.tracking.run.CONNECT_TIMEOUT_S` and
    :data:`pipeline.runtime.cluster.RAY_CONNECT_TIMEOUT_S`: the tests of an unreachable
    server or cluster then fail in 2 s, not 15 or 30.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ASYNC_BOUNDARIES_ENV = "SIMCSE_TEST_ASYNC_BOUNDARIES"
HOLD_ENV = "SIMCSE_TEST_HOLD"
HOLD_DIR_ENV = "SIMCSE_TEST_HOLD_DIR"
CONNECT_TIMEOUT_ENV = "SIMCSE_TEST_CONNECT_TIMEOUT_S"
RAY_START_TIMEOUTS_ENV = "SIMCSE_TEST_RAY_START_TIMEOUTS"
ACTOR_SEAMS = (ASYNC_BOUNDARIES_ENV, HOLD_ENV, HOLD_DIR_ENV)
"""The seams read inside the job's actors, not by the driver."""


def actor_runtime_env() -> dict[str, dict[str, str]]:
    """A ``runtime_env`` that carries the actor seams set in this (the driver's) process to the
    job's actors. A local Ray started by the job hands its environment to its processes; a Ray
    that was already running (a joined cluster, a test's Ray) does not. Empty when no seam is
    set, so a run without them starts its actors as it always did (a runtime_env of its own
    would keep an actor off Ray's pool of started workers)."""
    env = {name: os.environ[name] for name in ACTOR_SEAMS if os.environ.get(name)}
    return {"env_vars": env} if env else {}


def scripted_boundaries(value: str | None) -> list[str]:
    """The outcomes that ``SIMCSE_TEST_ASYNC_BOUNDARIES`` scripts, in boundary order."""
    words = [w.strip() for w in (value or "").split(",") if w.strip()]
    unknown = sorted(set(words) - {"ready", "late"})
    if unknown:
        raise ValueError(f"{ASYNC_BOUNDARIES_ENV}: expected ready or late, got {', '.join(unknown)}")
    return words


def connect_timeout_s(fixed_s: float) -> float:
    """``SIMCSE_TEST_RAY_START_TIMEOUTS``
        How many of the job's first starts of its own local Ray end as Ray's own "node timed out
        during startup" does (after Ray really started, so that the retry's cleanup runs): what a
        loaded machine makes happen by chance (:func:`pipeline.runtime.cluster.start_local_ray`).
    ``SIMCSE_TEST_CONNECT_TIMEOUT_S`` seconds when a test set it, else ``fixed_s``."""
    return float(os.environ.get(CONNECT_TIMEOUT_ENV) or fixed_s)


def hold_once(point: str, key: int) -> None:
    """Block here if ``SIMCSE_TEST_HOLD`` names ``point=key`` and no process has held here yet
    in this run (see the module's docstring); return at once otherwise."""
    spec = os.environ.get(HOLD_ENV)
    if not spec or f"{point}={key}" not in {item.strip() for item in spec.split(",")}:
        return
    folder = Path(os.environ[HOLD_DIR_ENV])
    held, release = folder / f"{point}={key}.held", folder / f"{point}={key}.release"
    try:
        with held.open("x") as note:  # its process id: what a test kills
            note.write(str(os.getpid()))
    except FileExistsError:
        return  # held once already: a restarted process goes on
    while not release.exists():
        time.sleep(0.05)
