"""Free heap handed back (pipeline/core/heap.py): holes between used chunks leave the resident
set, which freeing alone does not do."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pipeline.core.heap import _glibc, release_free_heap, release_shared_pages

CHUNK = 64 * 1024  # below glibc's mmap threshold: these come from the heap
CHUNKS = 3_000  # 192 MiB


def resident_kib(field: str) -> int:
    """This process' ``field`` of /proc/self/status (``RssAnon``, ``RssShmem``), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


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
    before = resident_kib("RssAnon")
    assert release_free_heap()
    after = resident_kib("RssAnon")
    try:
        assert before - after > 0.8 * freed_kib
    finally:
        for block in kept:
            libc.free(block)


def test_pages_of_an_object_read_from_the_store_leave_the_resident_set_and_stay_readable(ray_local):
    ray = ray_local
    data = np.arange(64 * 2**20 // 8, dtype=np.int64)  # 64 MiB: in the store, not inlined
    got = ray.get(ray.put(data))  # a view of the store's pages
    assert int(got.sum()) == int(data.sum())  # every page read: resident
    before = resident_kib("RssShmem")
    dropped = release_shared_pages(got.ctypes.data, got.nbytes)
    assert dropped > got.nbytes - 2 * 4096  # the whole pages inside it
    assert before - resident_kib("RssShmem") > 0.9 * got.nbytes // 1024
    np.testing.assert_array_equal(got, data)  # read back from the store


def test_private_memory_is_never_dropped():
    data = np.ones(4 * 2**20, dtype=np.int64)  # 32 MiB of this process' own heap
    assert release_shared_pages(data.ctypes.data, data.nbytes) == 0
    assert int(data.sum()) == len(data)
