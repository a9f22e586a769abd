"""A Ray cluster of several nodes on one machine, for the multi-node tests and
``python -m bench.chaos --mode node-loss``: a ``ray start --head`` of its own beside whatever
other Ray runs here, and worker nodes that join it, each a real raylet and object store, each
stopped (or lost) by its own process group. Ray's own stop command would end every Ray on
the host, so nothing here calls it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import job_env
from pipeline.runtime.cluster import free_port

PYTHON = sys.executable
# Ray's command line through the interpreter: the GPU bundle carries no console scripts.
RAY_CLI = [PYTHON, "-m", "ray.scripts.scripts"]

NODE_STARTS = 3
"""``ray start`` runs a worker node may take to join (:meth:`RayWorkerNode.wait_joined`)."""

RAY_START_TIMED_OUT = "timed out during startup"
"""What ``ray start`` prints when its raylet did not register with the head in its 30 s."""


class RayHead:
    """A ``ray start --head`` of the test's own, beside whatever other Ray runs on the machine.

    Every default port is replaced by a free one (another head may hold 6379, 8265, 10001
    and the dashboard agent's 52365), its processes are told their own dashboard address
    (so Ray's state API inside it never guesses another cluster), and :meth:`stop` ends
    only its own processes, by process group: Ray's own stop command would end every Ray on the
    host.
    """

    def __init__(self, tmp: Path, num_cpus: int = 4, ray_tmpdir: Path | None = None):
        bin_dir = Path(PYTHON).parent
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        # The job's `python` is resolved on the PATH of whoever started the head: the venv first.
        self.env = job_env(
            {
                "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "RAY_API_SERVER_ADDRESS": self.dashboard,
            }
        )
        # Ray's root folder (it writes ray_current_cluster there, which Ray's auto-detection
        # reads). Short: Ray's unix socket paths have a length limit.
        self.temp = ray_tmpdir or Path("/tmp") / f"rayt{os.getpid()}-{self.gcs_port}"
        self.env["RAY_TMPDIR"] = str(self.temp)
        tmp.mkdir(parents=True, exist_ok=True)
        # The nodes' temp folder (the worker nodes share this env): what a process killed with
        # its node leaves there (its model copies) goes with the head's folder, not into /tmp.
        # Short as well: under a pytest folder's long path Ray's client server failed to start.
        (self.temp / "tmp").mkdir(parents=True, exist_ok=True)
        self.env["TMPDIR"] = str(self.temp / "tmp")
        self.log = tmp / "ray-head.log"
        self.proc = subprocess.Popen(
            [
                *RAY_CLI, "start", "--head", "--block", f"--port={self.gcs_port}",
                f"--num-cpus={num_cpus}", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
                "--disable-usage-stats",
            ],
            env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._wait_ready(timeout=180)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def _wait_ready(self, timeout: float) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ray start exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Ray head's dashboard did not answer within {timeout:g}s")

    def stop(self) -> None:
        """End the head's own processes (:func:`stop_process_group`) and remove its folder."""
        stop_process_group(self.proc)
        shutil.rmtree(self.temp, ignore_errors=True)

    @contextlib.contextmanager
    def addressed(self):
        """Ray's state and job-submission clients in this process aimed at this head for the
        block. They read ``RAY_API_SERVER_ADDRESS`` before the address they are given
        (``ray.dashboard.utils.get_address_for_submission_client``), and a test process that
        holds ``ray_local`` has it set to that Ray's dashboard."""
        saved = os.environ.get("RAY_API_SERVER_ADDRESS")
        os.environ["RAY_API_SERVER_ADDRESS"] = self.dashboard
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("RAY_API_SERVER_ADDRESS", None)
            else:
                os.environ["RAY_API_SERVER_ADDRESS"] = saved

    def alive_on(self, class_name: str) -> set[str]:
        """The node ids of the live actors of ``class_name``, by Ray's state API."""
        from ray.util.state import list_actors

        with self.addressed():
            actors = list_actors(
                address=self.dashboard,
                filters=[("class_name", "=", class_name), ("state", "=", "ALIVE")],
                raise_on_missing_output=False,  # the filtered-out actors are not lost output
            )
        return {actor.node_id for actor in actors}

    def node_ids(self) -> dict[str, str]:
        """The live nodes' ids by name: ``head``, and each :class:`RayWorkerNode`'s name."""
        from ray.util.state import list_nodes

        named = {}
        with self.addressed():
            # Without raise_on_missing_output=False, Ray reads the dead nodes it filtered out as
            # output lost to truncation, and raises.
            alive = list_nodes(
                address=self.dashboard,
                filters=[("state", "=", "ALIVE")],
                detail=True,
                raise_on_missing_output=False,
            )
        for node in alive:
            tags = [r.removeprefix(NODE_TAG) for r in node.resources_total if r.startswith(NODE_TAG)]
            named["head" if node.is_head_node else tags[0] if tags else node.node_id] = node.node_id
        return named


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM a ``ray start --block`` process group (``ray start`` is its leader), then SIGKILL
    whatever of it is left after a few seconds: Ray's own stop command would end every Ray on
    the host."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or the group never looks empty
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break  # the group is gone, and its id free for another process: no SIGKILL
        time.sleep(0.25)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


NODE_TAG = "test_node_"
"""A custom resource (one unit) that names a test's worker node: Ray's state API lists it."""


class RayWorkerNode:
    """A ``ray start --block --address=...`` worker node of a :class:`RayHead`, a real raylet and
    object store on this machine, stopped by its own process group.

    ``labels``: Ray node labels (``ray start --labels``), what ``train.label_selector`` and
    ``mining.label_selector`` select.

    ``join``: wait until the node has joined (the default), or return at once and let
    :meth:`wait_joined` wait: nodes started together join together, as a cluster's machines do.

    ``hidden``: folders this node must not see, as a node of a real cluster does not see the
    driver's disk. The node starts in a mount namespace of its own with an empty private tmpfs
    over each (``unshare -m``, as root): a path there is empty for its processes, and whatever
    they write there stays in that tmpfs. Everything else (the venv, the shared folders a test
    gives as storage) is the same disk. Each node has a Ray folder of its own, as each machine
    of a cluster has: where nodes share one, a node that drops a job's unpacked working
    directory deletes it under the driver on the head.
    """

    def __init__(
        self,
        head: RayHead,
        name: str,
        *,
        num_cpus: float,
        num_gpus: int = 0,
        labels: dict[str, str] | None = None,
        hidden: tuple[Path, ...] = (),
        timeout: float = 300,
        join: bool = True,
    ):
        import json

        self.head, self.name = head, name
        self.temp = Path("/tmp") / f"rn{free_port()}"  # short: Ray's socket paths have a length limit
        start = [
            *RAY_CLI, "start", "--block", f"--address={head.address}", f"--temp-dir={self.temp}",
            f"--num-cpus={num_cpus:g}", f"--num-gpus={num_gpus}", f"--resources={json.dumps({NODE_TAG + name: 1})}",
            f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats",
        ]  # fmt: skip
        if labels:
            start.append("--labels=" + ",".join(f"{key}={value}" for key, value in labels.items()))
        if hidden:
            mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(folder))}" for folder in hidden)
            start = [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"{mounts} && exec {shlex.join(start)}",
            ]
        self.log = head.log.with_name(f"ray-node-{name}.log")
        self.log.write_text("")
        self._start, self._starts = start, 0
        self._deadline = time.monotonic() + timeout
        self._launch()
        if join:
            self.wait_joined()

    def _launch(self) -> None:
        self._starts += 1
        self.proc = subprocess.Popen(
            self._start, env=self.head.env, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_joined(self) -> RayWorkerNode:
        """Block until the node's raylet has joined the head (``join=False`` starts it without
        waiting, so that several nodes start at once). Returns the node.

        ``ray start`` gives a raylet a fixed 30 s to register with the head and then exits
        (``ray/_private/node.py``); on cores busy with other work that can pass, so a start that
        ends so is made again, up to :data:`NODE_STARTS` starts within the node's timeout."""
        # ray start says so once its raylet has joined: its log, no call to the head needed.
        while "Ray runtime started" not in self.log.read_text():
            exited = self.proc.poll() is not None
            in_time = time.monotonic() <= self._deadline
            # The log read after the exit is seen, so it holds the start's last line.
            timed_out = exited and RAY_START_TIMED_OUT in self.log.read_text()
            if timed_out and in_time and self._starts < NODE_STARTS:
                self.stop()
                self._launch()
                continue
            if exited or not in_time:
                self.stop()
                raise RuntimeError(f"worker node {self.name} did not join: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        stop_process_group(self.proc)
        shutil.rmtree(self.temp, ignore_errors=True)

    def lose(self) -> None:
        """The node lost, as a machine that vanishes: SIGKILL to its raylet, object store and
        every process it runs (its process group), nothing told beforehand. Ray's control
        plane finds out by its health checks."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.stop()  # reaps the group and removes the node's Ray folder
