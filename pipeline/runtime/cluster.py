"""Which Ray a job runs on, and how it gets there without touching anyone else's.

A machine may run several Ray instances at once: a ``ray start`` head, another user's job,
a test. Ray's own defaults guess "the" cluster (``/tmp/ray/ray_current_cluster``, or a
scan for ``gcs_server`` processes), and a guess on a shared machine joins or queries the
wrong one. So a job never lets Ray guess:

* ``ray.address`` (or ``RAY_ADDRESS``, set by ``ray job submit``) names a cluster: the job
  first checks, within :data:`RAY_CONNECT_TIMEOUT_S`, that something answers there, and then
  joins exactly that address.
* Otherwise the job starts its own local Ray (``address="local"``: Ray never looks for
  other clusters), on free ports, with its dashboard on loopback only, and tells every
  process of that Ray where that dashboard is (``RAY_API_SERVER_ADDRESS``). Ray Train's
  placement-group cleaner and Ray Data's hang detector call the state API from inside the
  cluster; without that variable they would query whichever cluster Ray guesses and, for
  instance, declare the Train controller dead because another cluster does not know it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import ray
from ray.data import DataContext

from pipeline.config.schema import Config
from pipeline.core.errors import ConfigError, UnrecoverableError
from pipeline.core.retry import call_with_retries
from pipeline.core.seams import RAY_START_TIMEOUTS_ENV, connect_timeout_s
from pipeline.mining.miner_settings import MinerSettings

log = logging.getLogger("pipeline")


LOOPBACK = "127.0.0.1"
RAY_CONNECT_TIMEOUT_S = 30.0
"""How long a job waits for the cluster at ``ray.address`` / ``RAY_ADDRESS`` to answer before
it fails with one line (Ray's own client retries a dead address for many minutes). A live
head answers a TCP connect at once; 30 s covers a head that is still starting."""
"""Where a local Ray's dashboard and the ports picked for it listen: this machine only."""
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
"""Read by Ray's state API (``get_address_for_submission_client``) before any guessing."""


@contextmanager
def ray_session(cfg: Config, debug: bool = False) -> Iterator[bool]:
    """Ray for the length of a job: yields True when it started a local Ray, which it then
    shuts down on the way out (a joined cluster is left running). ``debug`` (the job's
    ``--debug``) turns Ray Data's progress bars on."""
    saved = os.environ.get(API_SERVER_ENV)
    started = False
    try:
        started = init_ray(cfg, debug)
        yield started
    finally:
        if started:
            ray.shutdown()
        # The variable pointed at the Ray just shut down: a later job in this process (tests
        # run several) must not inherit it.
        if saved is None:
            os.environ.pop(API_SERVER_ENV, None)
        else:
            os.environ[API_SERVER_ENV] = saved


def cluster_address(cfg: Config) -> str | None:
    """The cluster the job joins, or None to start a local Ray (``"local"`` also means that)."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    return None if address == "local" else address


def init_ray(cfg: Config, debug: bool = False) -> bool:
    """Join the configured cluster, or start a local Ray. Returns True when started here.
    Ray Data's progress bars are on with ``debug`` only: they flood non-interactive logs.

    Raises:
        UnrecoverableError: the configured cluster did not answer within
            :data:`RAY_CONNECT_TIMEOUT_S`.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Train's print patch re-emits every worker print through its logger: each line twice.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    address = cluster_address(cfg)
    if ray.is_initialized():
        started = False
    elif address:
        wait_for_cluster(
            address,
            connect_timeout_s(RAY_CONNECT_TIMEOUT_S),
            "ray.address" if cfg.ray.address else "RAY_ADDRESS",
        )
        ray.init(address=address, logging_level=logging.WARNING)
        started = False
    else:
        start_local_ray(cfg)
        started = True
    context = DataContext.get_current()
    context.enable_progress_bars = debug
    # Off is the job's choice (on with --debug), so Ray Data's warning that they are off, and
    # how to turn them on, is noise on every job: silence just that logger.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.NOTSET if debug else logging.ERROR)
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return started


RAY_START_ATTEMPTS = 3
"""Starts of the job's own local Ray before its failure is the job's."""
NODE_START_TIMEOUT = "The current node timed out during startup"
"""How Ray's ``ray.init`` fails when its raylet did not register within Ray's fixed 30 s."""


def start_local_ray(cfg: Config) -> None:
    """A Ray of this job's own, beside whatever other Ray runs on the machine. Its dashboard
    listens on loopback only; a dashboard on the network is a Ray started by the user
    (``ray start --head --dashboard-host ...``) that ``ray.address`` points at.

    Ray gives the new node's raylet a fixed 30 s to register, which a loaded machine (a test
    suite, another job) can miss: that failure is retried, up to :data:`RAY_START_ATTEMPTS`
    starts, once the processes the failed start left (this process' new children) are ended."""
    import psutil  # deferred: Ray's dependency

    me = psutil.Process()
    attempts = itertools.count(1)

    def start() -> None:
        attempt = next(attempts)
        before = {child.pid for child in me.children(recursive=True)}
        try:
            _init_local_ray(cfg)
            if attempt <= int(os.environ.get(RAY_START_TIMEOUTS_ENV) or 0):
                raise RuntimeError(f"{NODE_START_TIMEOUT} ({RAY_START_TIMEOUTS_ENV})")
        except Exception as exc:
            if NODE_START_TIMEOUT not in str(exc):
                raise
            ray.shutdown()
            for child in me.children(recursive=True):
                if child.pid not in before:
                    with contextlib.suppress(psutil.Error):
                        child.kill()
            if attempt < RAY_START_ATTEMPTS:
                print(
                    f"[ray] the local Ray's node did not start within Ray's 30 s (a loaded machine?); "
                    f"starting it again ({attempt + 1}/{RAY_START_ATTEMPTS})",
                    flush=True,
                )
            raise _NodeStartTimedOut from exc

    try:
        call_with_retries(start, retry_on=_NodeStartTimedOut, attempts=RAY_START_ATTEMPTS, wait_s=0)
    except _NodeStartTimedOut as failed:
        raise failed.__cause__ from None  # Ray's own error, as the job reports it


class _NodeStartTimedOut(Exception):
    """A start of the local Ray whose node missed Ray's 30 s (Ray's error is its cause)."""


def _init_local_ray(cfg: Config) -> None:
    port = free_port()
    # Set before ray.init: Ray's processes (raylet, workers, actors) inherit the driver's
    # environment when they start, and none of them may guess another cluster.
    os.environ[API_SERVER_ENV] = f"http://{LOOPBACK}:{port}"
    ray.init(
        address="local",
        num_cpus=cfg.ray.num_cpus,
        # Ray Train's placement-group cleaner polls the state API, which the dashboard
        # serves. It also serves the job-submission API, which runs any code it is sent:
        # on loopback, only this machine's users reach it.
        include_dashboard=True,
        dashboard_host=LOOPBACK,
        dashboard_port=port,
        logging_level=logging.WARNING,
    )


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the OS's choice, so two jobs do not pick
    the same)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``, ``ray://host:port`` or ``http://host:port``; None
    for forms Ray resolves itself (``auto``)."""
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def wait_for_cluster(address: str, timeout_s: float, source: str = "ray.address") -> None:
    """Fail with one line when nothing answers at ``address`` within ``timeout_s``.

    Ray's own client retries a dead GCS for many minutes, printing a warning every 30 s;
    a TCP connect tells up front whether a cluster is there at all.

    Raises:
        UnrecoverableError: naming the address, where it came from and the timeout.
    """
    target = _host_port(address)
    if target is None:
        return

    def connect() -> None:
        with socket.create_connection(target, timeout=max(0.5, min(5.0, timeout_s))):
            return

    try:
        call_with_retries(connect, retry_on=OSError, timeout_s=timeout_s, wait_s=0.5)
    except OSError as exc:
        raise UnrecoverableError(
            f"no Ray cluster answers at {source}={address} ({exc.strerror or exc}) after "
            f"{timeout_s:g}s; start it, fix the address, or unset it "
            "to start a local Ray"
        ) from None


def miner_shards(cfg: Config, resources: dict[str, float]) -> int:
    """``mining.shards``, or where it is null the count the cluster's ``resources`` give: with
    ``mining.num_gpus`` > 0, one shard per ``num_gpus`` of the GPUs beyond the train workers'
    (at least 1); on CPUs, 1. The config keeps null (it is resolved where the job runs, as the
    cluster is), so every reader of the run's config asks here."""
    mining = cfg.mining
    if mining.shards is not None:
        return mining.shards
    if not (cfg.runs_miner and mining.num_gpus > 0):
        return 1
    spare = resources.get("GPU", 0.0) - cfg.train.num_workers * cfg.train.gpus_per_worker
    return max(1, int(spare / mining.num_gpus + 1e-9))


def check_cluster_fits(cfg: Config, started_locally: bool) -> None:
    """Fail with a clear error instead of waiting forever for resources that cannot exist.

    Only for a Ray started here: an autoscaling cluster may still grow to fit.
    """
    total = ray.cluster_resources()
    shards = miner_shards(cfg, total)
    miner = MinerSettings.from_config(cfg, shards=shards)
    miner_cpus, miner_gpus = miner.reserved() if cfg.runs_miner else (0.0, 0.0)
    cpu_need = cfg.train.num_workers * cfg.train.cpus_per_worker + miner_cpus
    gpu_need = cfg.train.num_workers * cfg.train.gpus_per_worker + miner_gpus
    # The miner's own terms: with shards, each of them holds the miner's resources too.
    cpus_term = "mining.num_cpus" if shards == 1 else f"mining.num_cpus x (1 + {shards} mining.shards)"
    gpus_term = "mining.num_gpus" if shards == 1 else f"mining.num_gpus x {shards} mining.shards"
    problems = []
    if cfg.data.tokenize_num_cpus > total.get("CPU", 0):
        problems.append(
            f"data.tokenize_num_cpus = {cfg.data.tokenize_num_cpus:g}, but the cluster has {total.get('CPU', 0):g} CPUs"
        )
    if cpu_need > total.get("CPU", 0):
        problems.append(
            f"train.num_workers x train.cpus_per_worker + {cpus_term} = {cpu_need:g} CPUs, "
            f"but the cluster has {total.get('CPU', 0):g}"
        )
    if gpu_need > total.get("GPU", 0):
        problems.append(
            f"{gpu_need:g} GPUs needed (train.num_workers x train.gpus_per_worker + {gpus_term}), the cluster has {total.get('GPU', 0):g}"
        )
    if problems and started_locally:
        raise ConfigError("; ".join(problems))
    for problem in problems:
        log.warning("resources may not fit yet (waiting for the autoscaler?): %s", problem)
