"""Resident memory of building and searching an IVF index from vectors computed a chunk at a
time, as a miner shard builds one, with the freed heap handed back to the OS as the index grows
(:func:`pipeline.core.heap.release_free_heap`, what the code does) and without.

    python -m bench.index_heap --rows 1000000

Each arm runs in a process of its own: random unit vectors (``--dim``) from a
:class:`~pipeline.mining.index.VectorSource`, an ``ivf`` index over them (its ``nprobe``
calibration skipped: not what is measured), then one search of 65,536 of them for their top 64.
The table gives the process' own heap (``RssAnon``) and peak RSS (``VmHWM``) after the build
and after the search.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from bench.common import Benchmark, machine_report, status_bytes

BENCHMARK = Benchmark("bench.index_heap", "Mining refresh over shards")
ARMS = ("released", "kept")
QUERIES, TOP_K = 65_536, 64


def status() -> dict[str, int]:
    """This process' ``RssAnon`` and ``VmHWM`` in bytes."""
    return {key: status_bytes(os.getpid(), key) for key in ("RssAnon", "VmHWM")}


def measure(arm: str, rows: int, dim: int) -> dict[str, dict[str, int]]:
    """One arm in this process: build, then search; what it held after each."""
    import bench.embedded_texts as embedded_texts
    import pipeline.mining.index as index

    if arm == "kept":
        index.release_free_heap = lambda: False
    embedded_texts.calibrate_nprobe = lambda *args, **kwargs: (index.NPROBE, 1.0)

    def vectors(positions: np.ndarray) -> np.ndarray:
        x = np.random.default_rng(int(positions[0])).standard_normal((len(positions), dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    built = embedded_texts.vector_index(index.VectorSource(rows, dim, vectors), kind="ivf")
    after_build = status()
    built.search(vectors(np.arange(QUERIES)), TOP_K)
    return {"build": after_build, "search": status()}


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm:
        print(json.dumps(measure(args.arm, args.rows, args.dim)))
        return 0
    results = {}
    for arm in ARMS:
        out = subprocess.run(
            [sys.executable, "-m", BENCHMARK.module, "--rows", str(args.rows), "--dim", str(args.dim), "--arm", arm],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        results[arm] = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 2**20
    lines = [
        f"| {args.rows:,} x {args.dim} IVF | own heap after build MiB | own heap after search MiB | peak RSS MiB |",
        "|---|---|---|---|",
    ]
    for arm in ARMS:
        got = results[arm]
        lines.append(
            f"| freed heap {arm} | {got['build']['RssAnon'] / mib:,.0f} | {got['search']['RssAnon'] / mib:,.0f} "
            f"| {got['search']['VmHWM'] / mib:,.0f} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.append:
        BENCHMARK.append(
            "The freed heap handed back while an IVF index is built", machine_report(), body, path=args.append
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
