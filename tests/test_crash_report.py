"""A test process that dies under pytest-xdist is reported with what may say why
(``tests/crash_report.py``): checked on a real inner pytest run whose one test starts a local
Ray and then SIGKILLs its own process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

DYING_TEST = """
import os
import signal

import ray
from crash_report import ray_session_noted


def test_dies():
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    with ray_session_noted(ray._private.worker._global_node.get_session_dir_path()):
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_dead_test_process_is_reported_with_its_ray_logs_and_the_kernel_lines(tmp_path):
    (tmp_path / "test_dying.py").write_text(DYING_TEST)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "crash_report", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "test_dying.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "worker 'gw0' crashed while running 'test_dying.py::test_dies'" in text
    assert "kernel (dmesg):" in text
    assert "/logs/raylet.out:" in text and "/logs/gcs_server.out:" in text, text
