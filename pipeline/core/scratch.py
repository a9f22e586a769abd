"""A process's private temp folder, and the ones that killed processes left behind.

Every train worker, miner shard and teacher unpacks its model into a temp folder (420 MB for a
base-size model) that is removed when its block ends or fails. A process killed outright (the
OOM killer, the raylet ending a worker, ``ray kill``) runs no cleanup, and on a node that
survives, its folder stays until the node reboots: a job that Ray Train restarts after each of
several OOM kills leaves one model copy a kill. So each folder's name carries its owner's pid
and host, and a process opening a new folder of the same prefix first removes those whose owner
is gone.

A folder is removed only where all of these hold: its name has this prefix and this host's
name, the current user owns it, and no live process of that pid exists (a zombie, killed but
not yet reaped by its parent, runs no code and counts as gone). A live process of another
user, a process of another host or container with its own hostname sharing the folder, and old
folders without a pid in their name are left alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def owner_tag() -> str:
    """``<pid>@<host>``: the part of a scratch folder's name that says whose it is."""
    return f"{os.getpid()}@{socket.gethostname()}"


@contextmanager
def process_scratch(prefix: str) -> Iterator[Path]:
    """A new folder ``<prefix><pid>@<host>-<random>`` in the temp folder (``TMPDIR``, else
    ``/tmp``), removed when the block ends or fails; those of the same prefix whose process was
    killed are removed first (:func:`remove_orphaned_scratch`)."""
    remove_orphaned_scratch(prefix)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{owner_tag()}-") as folder:
        yield Path(folder)


def remove_orphaned_scratch(prefix: str) -> None:
    """Remove the :func:`process_scratch` folders of ``prefix`` in the temp folder whose owning
    process, on this host and of this user, no longer exists."""
    host = socket.gethostname()
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*@*-*"):
        pid = orphan_owner(folder.name[len(prefix) :], host)
        try:
            if pid is None or folder.stat().st_uid != os.getuid() or not folder.is_dir():
                continue
        except FileNotFoundError:  # another process removed it first
            continue
        if not process_exists(pid):
            shutil.rmtree(folder, ignore_errors=True)


def orphan_owner(tail: str, host: str) -> int | None:
    """The pid in a scratch name's ``<pid>@<host>-<random>`` tail when its host is ``host``;
    None for any other name."""
    owner, _, _random = tail.rpartition("-")
    pid, _, owner_host = owner.partition("@")
    return int(pid) if pid.isdigit() and owner_host == host else None


def process_exists(pid: int) -> bool:
    """Whether a live process of ``pid`` exists here (of any user): not a zombie, whose folder
    would otherwise wait until its parent reaps it and a later process of its kind starts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    try:
        # The state follows the command name, which is in parentheses and may hold spaces.
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # gone since the kill; or no /proc (not Linux)
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
