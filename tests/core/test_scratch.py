"""Scratch folders of processes killed outright (pipeline/core/scratch.py): the next process of
the same kind removes them, and nothing that may still be in use."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from pipeline.core.scratch import orphan_owner, process_scratch

REPO = Path(__file__).resolve().parents[2]

# Holds its folder until the test closes its stdin or kills it: no clock decides when it ends.
HOLDER = """
import sys
from pipeline.core.scratch import process_scratch
with process_scratch(sys.argv[1]) as folder:
    (folder / "model.safetensors").write_bytes(b"w" * 4096)
    print(folder, flush=True)
    sys.stdin.read()
"""


def hold_scratch(prefix: str, temp: Path) -> tuple[subprocess.Popen, Path]:
    """A process that opens a scratch folder of ``prefix`` in ``temp`` and keeps it open."""
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, prefix],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_process_folder_goes_with_the_next_and_nothing_in_use(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    killed, killed_folder = hold_scratch("simcse-model-", temp)
    alive, alive_folder = hold_scratch("simcse-model-", temp)
    other_kind, other_kind_folder = hold_scratch("simcse-worker-", temp)
    try:
        killed.kill()  # SIGKILL: no cleanup runs, as for the OOM killer
        killed.wait()
        other_kind.kill()
        other_kind.wait()
        assert (killed_folder / "model.safetensors").is_file()  # what a killed process leaves
        other_host = temp / f"simcse-model-{killed.pid}@not-{socket.gethostname()}-abc_1234"
        unnamed = temp / "simcse-model-k2x9_q7a"  # the name before pids were in it
        for folder in (other_host, unnamed):
            folder.mkdir()

        monkeypatch.setattr("tempfile.tempdir", str(temp))
        with process_scratch("simcse-model-") as mine:
            assert mine.parent == temp and mine.is_dir()
            assert not killed_folder.exists()
            assert (alive_folder / "model.safetensors").is_file()  # its process still reads it
            assert other_kind_folder.is_dir()  # another prefix's: that kind's next process removes it
            assert other_host.is_dir() and unnamed.is_dir()
        assert not mine.exists()
        with process_scratch("simcse-worker-"):
            assert not other_kind_folder.exists()
    finally:
        for proc in (killed, alive, other_kind):
            proc.kill()
            proc.wait()


def test_a_killed_process_not_yet_reaped_counts_as_gone(tmp_path, monkeypatch):
    """A zombie still answers ``kill(pid, 0)``, but runs no code: its folder goes too."""
    temp = tmp_path / "temp"
    temp.mkdir()
    zombie, zombie_folder = hold_scratch("simcse-model-", temp)
    try:
        zombie.kill()
        # Wait for it to end without reaping it: it stays a zombie until zombie.wait() below.
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
        assert Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
        monkeypatch.setattr("tempfile.tempdir", str(temp))
        with process_scratch("simcse-model-"):
            assert not zombie_folder.exists()
    finally:
        zombie.kill()
        zombie.wait()


def test_the_owner_is_read_from_the_name_only_on_its_own_host():
    assert orphan_owner("123@node-a-7-x_k2abcd", "node-a-7") == 123
    assert orphan_owner("123@node-a-7-x_k2abcd", "node-b") is None
    assert orphan_owner("k2x9_q7a", "node-a-7") is None
    assert orphan_owner("12a@node-a-7-x_k2abcd", "node-a-7") is None
