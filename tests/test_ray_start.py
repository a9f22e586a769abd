"""A job's own local Ray, started again when Ray's node missed its fixed 30 s to register (what
a loaded machine makes happen by chance: made to happen here through the seam)."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, REPO

from bench.common import job_env
from pipeline.core.seams import RAY_START_TIMEOUTS_ENV

SCRIPT = """
import psutil, ray
from pipeline.config.loading import load_config
from pipeline.runtime.cluster import ray_session

with ray_session(load_config(None, ["ray.num_cpus=2"])):
    gcs = [c for c in psutil.Process().children(recursive=True) if c.name().startswith("gcs_server")]
    print("cpus", ray.cluster_resources()["CPU"], "gcs servers", len(gcs))
"""


def test_a_local_ray_whose_node_timed_out_is_started_again_and_the_first_one_ended():
    proc = subprocess.run(
        [PYTHON, "-c", SCRIPT], cwd=REPO, env=job_env({RAY_START_TIMEOUTS_ENV: "1"}),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "[ray] the local Ray's node did not start within Ray's 30 s" in proc.stdout
    assert "starting it again (2/3)" in proc.stdout
    # The second start is the one running, and the first one's processes are gone.
    assert "cpus 2.0 gcs servers 1" in proc.stdout


def test_a_local_ray_that_never_starts_fails_with_rays_own_error_after_three_starts():
    proc = subprocess.run(
        [PYTHON, "-c", SCRIPT], cwd=REPO, env=job_env({RAY_START_TIMEOUTS_ENV: "3"}),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "cpus" not in proc.stdout
    assert proc.stdout.count("starting it again") == 2  # the 2nd and 3rd starts, no 4th
    assert "RuntimeError: The current node timed out during startup" in proc.stderr
    assert "_NodeStartTimedOut" not in proc.stderr  # Ray's error, not the retry's own
