"""Handing the C heap's free pages back to the operating system.

A process that builds a large index in chunks (a miner shard adding 2.5M vectors 131,072 at a
time) frees each chunk and the encoder's temporaries between the index's growing lists, and
glibc keeps those holes resident: at 1M x 64 vectors an IVF build left 87 MB more resident
heap than one that released them, and the search's peak was 70 MB higher (docs/benchmarks.md,
"Mining refresh over shards"). Against a per-process memory budget that is the difference.
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
