"""The suite's check of a job's console (``conftest.unexpected_alarming_lines``): Ray 2.60's
crash of a pooled worker it ends for being idle is accepted only where that worker's own Ray
log shows the crash after the idle exit."""

from __future__ import annotations

from conftest import idle_exit_aborts

ABORT = "\x1b[36m(get_table_block_metadata_schema pid={pid})\x1b[0m [2026-11-29 08:48:33,076 E {pid} 18874] logging.cc:474: *** SIGABRT received at time=1795942113 on cpu 1 ***"  # noqa: E501


def _worker_log(folder, pid: int, text: str) -> None:
    logs = folder / "session_2026-11-29_08-38-53_841415_2442" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (
        logs / f"python-core-worker-af1bc415aa20202a56ce87ac982bb2014b7bdfb8f0ac4e71fba89663_{pid}.log"
    ).write_text(text)


def test_an_aborted_worker_counts_as_ray_s_idle_exit_crash_only_where_its_log_shows_it(tmp_path):
    idle = (
        "core_worker_shutdown_executor.cc:280: Executing handle exit: INTENDED_SYSTEM_EXIT - Worker exited "
        "because it was idle for a long time (timeout: -1ms)\n"
        "logging.cc:474: *** SIGABRT received at time=1795942113 on cpu 1 ***\n"
    )
    _worker_log(tmp_path, 17907, idle)
    # Aborted while it ran a task: no idle exit in its log.
    _worker_log(tmp_path, 17908, "logging.cc:474: *** SIGABRT received at time=1795942113 on cpu 1 ***\n")
    lines = [ABORT.format(pid=pid) for pid in (17907, 17908, 17909)] + ["(raylet) [x E y] another error"]
    assert idle_exit_aborts(lines, roots=(tmp_path,)) == {17907}  # 17909: no log found
    # A task name with parentheses of its own (Ray Data's shuffle): the same worker found.
    named = ABORT.replace("get_table_block_metadata_schema", "SortShuffleMap(partitions=1)").format(pid=17907)
    assert idle_exit_aborts([named], roots=(tmp_path,)) == {17907}


def test_a_segfault_counts_only_after_the_idle_exit(tmp_path):
    """Ray's metrics harvester thread segfaults on a mutex the ending worker already destroyed
    (seen in CI, 2026-12-02); the same signal before the idle exit is a task's crash."""
    idle_exit = (
        "core_worker_shutdown_executor.cc:280: Executing handle exit: INTENDED_SYSTEM_EXIT - Worker exited "
        "because it was idle for a long time (timeout: -1ms)\n"
    )
    segfault = "logging.cc:474: *** SIGSEGV received at time=1796212906 on cpu 1 ***\n"
    _worker_log(tmp_path, 17935, idle_exit + "core_worker.cc:688: Core worker is destructed\n" + segfault)
    _worker_log(tmp_path, 17936, segfault + idle_exit)
    lines = [ABORT.replace("SIGABRT", "SIGSEGV").format(pid=pid) for pid in (17935, 17936)]
    assert idle_exit_aborts(lines, roots=(tmp_path,)) == {17935}
