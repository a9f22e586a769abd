"""Free heap handed back (pipeline/core/heap.py): holes between used chunks leave the resident
set, which freeing alone does not do."""

from __future__ import annotations

import ctypes

import pytest

from pipeline.core.heap import _glibc, release_free_heap

CHUNK = 64 * 1024  # below glibc's mmap threshold: these come from the heap
CHUNKS = 3_000  # 192 MiB


def resident_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(_glibc() is None, reason="glibc's malloc_trim only")
def test_freed_holes_between_used_chunks_leave_the_resident_set():
    libc = _glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
    for block in blocks:
        ctypes.memset(block, 1, CHUNK)  # resident
    # Free nine chunks in ten; the tenth stays, so no free run reaches the heap's top.
    kept = blocks[9::10]
    for number, block in enumerate(blocks):
        if number % 10 != 9:
            libc.free(block)
    freed_kib = (CHUNKS - len(kept)) * CHUNK // 1024
    before = resident_anon_kib()
    assert release_free_heap()
    after = resident_anon_kib()
    try:
        assert before - after > 0.8 * freed_kib
    finally:
        for block in kept:
            libc.free(block)
