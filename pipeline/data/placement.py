"""Where an input's read tasks run: on any node, or on the one node whose disk holds the file.

A local path on a cluster may be a file on the driver's disk only (a generated corpus, a file
given on the command line): Ray Data would read it wherever it finds a CPU, and another node
has no such file. The driver checks which nodes see each local input
(:func:`pipeline.runtime.nodes.plan_reads`) and pins the reads of a file only it sees to its own
node; cleaning, hashing and tokenizing still run anywhere, on the blocks read there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node, its node id: a label selector on it pins a task to the node."""


@dataclass(frozen=True)
class ReadNodes:
    """Which inputs are read on one node only: ``pinned`` maps a path to that node's id."""

    pinned: Mapping[str, str] = field(default_factory=dict)

    def read_args(self, path: str) -> dict[str, Any]:
        """Ray Data read arguments for ``path``: none to read it anywhere; for a pinned path, its
        node by label and no CPU of the node's own (a KubeRay head offers none, and this is
        one file's read from one disk)."""
        node = self.pinned.get(path)
        if node is None:
            return {}
        return {"label_selector": {NODE_ID_LABEL: node}, "num_cpus": 0}


ANYWHERE = ReadNodes()
"""Every input read wherever Ray Data schedules it (one node, or shared storage)."""
