"""The harness the fault tests kill jobs through (``bench/running_job.py``) may signal only the
job's own processes: a pid or process group id it keeps after the job was reaped can name
another test's process once the kernel has gone round its pids."""

import psutil

from bench.running_job import RunningJob, wait_for


def test_an_exited_job_keeps_its_pid_until_killed_and_is_killed_once(tmp_path):
    job = RunningJob(tmp_path, ["train.no_such_setting=1"])
    pid = job.proc.pid
    wait_for(lambda: not job.running(), 60, "the job's exit")
    # Exited but not reaped: the pid (and so the group id) cannot go to another process yet.
    assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not job.running()  # asking again reaps nothing either
    assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

    assert job.wait(timeout=30) == 2
    assert job.output.startswith("error: unknown config key 'train.no_such_setting'")
    assert not psutil.pid_exists(pid)  # reaped by the kill, and nothing after it may use the pid
    assert job.processes("python") == []
    job.kill_all()  # a second kill is a no-op, not a signal to whatever holds the pid now
    assert job.proc.returncode == 2
