"""What every node of the cluster sees, checked before compute.

On one machine every process sees the same disk. On a cluster each node has its own, and a
local path names a different folder (or nothing) on each. Two things a job writes or reads
by path are checked on every live node, by a task pinned there (no CPU of its own: a KubeRay
head offers none):

* Ray Train's storage (``run.storage_path``, else ``run.output_dir``): every worker writes its
  checkpoints there and the driver exports from it. The driver writes a probe file and every
  node must read it back (:func:`check_storage_on_every_node`); a folder only some nodes see
  stops the job with one line before the first step.
* Local inputs (``data.path``, ``data.pool``): a file only the driver's node sees is read there
  (:func:`plan_reads`); cleaning and tokenizing still run on any node.

On a one-node Ray both are skipped: there is one disk.

One thing a multi-node job keeps in run storage for the same reason: the tokenized corpus
(:func:`rebuildable_from_storage`). A node can be lost while the job runs, with the only copy
of a block the tokenizer made there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pipeline.core.errors import ConfigError
from pipeline.data.formats import filesystem_of
from pipeline.data.placement import ANYWHERE, ReadNodes

Echo = Callable[[str], None]
PROBE_PREFIX = ".simcse-storage-probe-"


def live_nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes as ``ray.nodes()`` lists them."""
    return [node for node in ray.nodes() if node.get("Alive")]


def on_every_node(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` run once on every live node; its result by node id."""
    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    nodes = [node["NodeID"] for node in live_nodes()]
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(*args)
        for n in nodes
    ]
    return dict(zip(nodes, ray.get(refs), strict=True))


def _describe(node_id: str) -> str:
    address = next((n["NodeManagerAddress"] for n in live_nodes() if n["NodeID"] == node_id), "?")
    return f"node {node_id[:8]} at {address}"


def _read_probe(uri: str) -> str | None:
    """The probe's text as this node reads it; None when it cannot."""
    try:
        filesystem, path = filesystem_of(uri)
        with filesystem.open_input_stream(path) as stream:
            return stream.read().decode()
    except Exception:
        return None


def check_storage_on_every_node(storage_root: str, key: str) -> None:
    """Stop unless every live node reads back a probe the driver writes under ``storage_root``
    (``key`` names the setting it came from). The probe is removed either way.

    Raises:
        ConfigError: naming ``key``, the folder, a node that cannot see it, and what to give.
    """
    if len(live_nodes()) < 2:
        return
    filesystem, root = filesystem_of(storage_root)
    filesystem.create_dir(root, recursive=True)
    token = uuid.uuid4().hex
    probe = f"{root.rstrip('/')}/{PROBE_PREFIX}{token}"
    with filesystem.open_output_stream(probe) as stream:
        stream.write(token.encode())
    try:
        seen = on_every_node(_read_probe, f"{storage_root.rstrip('/')}/{PROBE_PREFIX}{token}")
    finally:
        filesystem.delete_file(probe)
    blind = [node for node, text in seen.items() if text != token]
    if blind:
        raise ConfigError(
            f"{key}: {storage_root} is not the same folder on every Ray node ({_describe(blind[0])} "
            f"does not see the file the driver wrote there, {len(blind)} of {len(seen)} nodes); "
            "Ray Train's workers write checkpoints there: give a URI (s3://, gs://) or a path every node mounts"
        )


def _local_file_sizes(paths: list[str]) -> list[int | None]:
    """Each local path's size as this node sees it (-1 for a folder, None: nothing there)."""

    def size(path: str) -> int | None:
        if os.path.isdir(path):
            return -1
        try:
            return os.path.getsize(path)
        except OSError:
            return None

    return [size(path) for path in paths]


def plan_reads(inputs: Mapping[str, str | None], echo: Echo) -> ReadNodes:
    """Where each local input of ``inputs`` (config key -> path) is read: anywhere when every
    live node sees the same file (a shared mount), else on the driver's node, which saw it when
    the config was checked. URIs are read anywhere.

    Prints one line for each input read on the driver's node only."""
    local = {key: path for key, path in inputs.items() if path is not None and "://" not in path}
    if not local or len(live_nodes()) < 2:
        return ANYWHERE
    here = ray.get_runtime_context().get_node_id()
    sizes = on_every_node(_local_file_sizes, [os.path.abspath(path) for path in local.values()])
    pinned: dict[str, str] = {}
    for i, (key, path) in enumerate(local.items()):
        blind = [node for node, seen in sizes.items() if seen[i] != sizes[here][i]]
        if blind:
            pinned[path] = here
            echo(
                f"[data] {key}: {path} is on the driver's disk only ({len(blind)} of {len(sizes)} nodes "
                "do not see it): read on the driver's node"
            )
    return ReadNodes(pinned) if pinned else ANYWHERE


BLOCK_READ_RETRIES = 5
"""How often Ray may run a block's read again: each time every copy of it was lost."""


def _write_block(block: pa.Table, uri: str) -> str:
    filesystem, path = filesystem_of(uri)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(block, path, filesystem=filesystem)
    return uri


def _read_block(uri: str) -> pa.Table:
    filesystem, path = filesystem_of(uri)
    return pq.read_table(path, filesystem=filesystem)


def rebuildable_from_storage(refs: list[Any], folder: str) -> list[Any]:
    """The blocks behind the object ``refs`` as objects Ray rebuilds when every copy of one is
    lost: each is written to ``folder`` (run storage, which every node reads) by a 0-CPU task
    beside it, then replaced by the output of a task that reads it back, which Ray runs again
    from its lineage where the object was lost (up to :data:`BLOCK_READ_RETRIES` times). The
    originals are released when the caller drops them.

    Why: the tokenized corpus is made by Ray Data's tokenizer actors on the worker nodes, and an
    actor's output is not rebuilt from lineage. A worker or miner that restarts after its node
    is lost fetches every block again; if each copy of a block was on nodes lost by then (one
    GPU node that tokenized and trained, two nodes lost at once), the restart would fail with
    ``ObjectLostError``. Storage holds the one spare copy, not the head's object store (16 GB
    of tokens at 100M rows)."""
    write = ray.remote(num_cpus=0)(_write_block)
    uris = ray.get(
        [write.remote(ref, f"{folder.rstrip('/')}/block-{k:05d}.parquet") for k, ref in enumerate(refs)]
    )
    read = ray.remote(num_cpus=0, max_retries=BLOCK_READ_RETRIES)(_read_block)
    loaded = [read.remote(uri) for uri in uris]
    ray.wait(loaded, num_returns=len(loaded), fetch_local=False)
    return loaded
