"""Handing memory a process no longer uses back to the operating system: the C heap's free
pages, and the object store's pages of objects it has finished reading.

A process that builds a large index in chunks (a miner shard adding 2.5M vectors 131,072 at a
time) frees each chunk and the encoder's temporaries between the index's growing lists, and
glibc keeps those holes resident: a 2.5M x 64 IVF build kept 102 MiB more of its own heap, and
its search's peak RSS was 104 MiB higher, than one that handed them back (``python -m
bench.index_heap --rows 2500000``, docs/benchmarks.md). Against a per-process memory budget
that is the difference.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): its allocator returns memory its own way
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_free_heap() -> bool:
    """Return every free page of the C heap to the operating system (glibc's ``malloc_trim``,
    which also releases free pages between used chunks, not only at the top). Returns whether
    the allocator could be asked; elsewhere it does nothing."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


MADV_DONTNEED = 4
"""Linux's ``madvise`` advice that drops a range's pages from this process (a shared file's
pages stay in the file, and are read back on the next access)."""


def release_shared_pages(address: int, size: int) -> int:
    """Drop this process' resident pages of the ``size`` bytes at ``address`` where they lie in
    a shared file mapping (Ray's object store, mapped into every worker): once a worker has
    copied rows out of an object it read, the object's pages need not count in its RSS (0.34 GB
    of a 10M-row miner shard's 2.1 GiB). The data is untouched: the store keeps it, and a later
    read maps it again. Only the whole pages inside the range are dropped, and nothing outside a
    shared mapping (a private page dropped would be zeroed). Returns the bytes dropped; 0 where
    the range is not in one shared mapping or ``madvise`` cannot be asked."""
    libc = _glibc()
    page = 4096
    first, last = -(-address // page) * page, (address + size) // page * page
    if libc is None or last <= first or not _in_shared_file_mapping(first, last):
        return 0
    if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED) != 0:
        return 0
    return last - first


def _in_shared_file_mapping(first: int, last: int) -> bool:
    """Whether ``first .. last`` lies within one shared, file-backed mapping of this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if low <= first and last <= high:
                return fields[1][3] == "s" and len(fields) >= 6 and fields[5].startswith("/")
    return False
