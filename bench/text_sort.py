"""The distinct texts into ranges of positions sorted by id: today's hand-written range partition
(:func:`pipeline.data.text_blocks.distinct_texts`) against Ray Data's ``sort("id",
boundaries=...)`` on the same cleaned blocks (issue 72, item 3: library first).

    python -m bench.text_sort --sizes 1000000,3000000 --arena 0,2

For each corpus size a headerless text file of ``--sizes`` lines is written (6 to 14 words over
a 20,000-word vocabulary, every 20th line a repeat of an earlier one: duplicates to drop). Each
arm runs in a fresh process on a local Ray of 4 logical CPUs, with ``MALLOC_ARENA_MAX`` (0:
unset) and ``RAY_max_direct_call_object_size`` set in the environment of Ray's processes.
Both arms start from the cleaned corpus in the object store, as the job has it
(:func:`pipeline.data.corpus.load_clean_corpus`'s read and cleaning stage), and end with the
same thing: each distinct text once, in consecutive ranges of positions (the bounds the job's
range count gives), each range sorted by id, materialized in the object store.

- ``ranges`` (today): the driver picks each id's first slot; tasks take the picks block group by
  block group and cut them per range; one task per range merges its pieces.
- ``ray-sort``: ``Dataset.select_columns(["id", "text"]).filter(id >= 0).sort("id",
  boundaries=bounds)``, then each block's repeated ids dropped (every copy of an id falls in
  one range: the bounds are ids) with ``map_batches``.

Printed per arm: the seconds from the cleaned blocks to the materialized ranges, the driver's
peak RSS (``VmHWM``), and the largest RSS of any other process of the Ray session (sampled
every 0.2 s). A check compares both arms' output: the same ids in
the same ranges, and the same texts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Benchmark, Sampler, machine_report, status_bytes

BENCHMARK = Benchmark(__spec__.name, "Distinct texts into sorted ranges: by hand or Ray Data's sort")
RESULT = "RESULT "


def write_corpus(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` lines of 6 to 14 words, every 20th a repeat of an earlier line."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i:05d}" for i in range(20_000)])
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            lengths = rng.integers(6, 15, size=n)
            words = vocabulary[rng.integers(0, len(vocabulary), size=(n, 14))]
            lines = [f"line {start + i} " + " ".join(words[i, : lengths[i]]) + "\n" for i in range(n)]
            for i in range(19, n, 20):
                lines[i] = lines[i - 7]
            out.writelines(lines)


class TreePeak(Sampler):
    """The largest RSS of any process under ``root`` but ``root`` itself, sampled."""

    def __init__(self, root: int, interval: float = 0.2):
        import psutil

        super().__init__(interval)
        self.root = psutil.Process(root)
        self.peak = 0

    def sample(self) -> None:
        import psutil

        for child in self.root.children(recursive=True):
            try:
                self.peak = max(self.peak, child.memory_info().rss)
            except psutil.Error:
                continue


def _first_of_each_id(batch: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    ids = batch.column("id").to_numpy()
    keep = np.ones(len(ids), dtype=bool)
    keep[1:] = ids[1:] != ids[:-1]
    return batch.filter(pa.array(keep))


def run_arm(path: str, arm: str) -> dict[str, Any]:
    """One arm in this process: clean the corpus, then partition it; the seconds, the driver's
    peak and the other processes' peak."""
    import ray

    from pipeline.config.data_section import DataSection
    from pipeline.config.loading import load_config
    from pipeline.core.distinct import sorted_distinct
    from pipeline.data.corpus import _clean_batch, read_corpus
    from pipeline.data.text_blocks import (
        TextColumns,
        block_columns,
        distinct_texts,
        materialized_blocks,
        range_count,
    )
    from pipeline.runtime.cluster import ray_session

    section = DataSection(path=path)
    with ray_session(load_config(None, ["ray.num_cpus=4"])):
        with TreePeak(os.getpid()) as tree:
            ds = read_corpus(section).map_batches(
                _clean_batch, batch_format="pyarrow", num_cpus=section.tokenize_num_cpus
            )
            blocks = materialized_blocks(ds)
            read, block_rows = block_columns(blocks, ["id"], section.tokenize_num_cpus)
            ids = read.column("id").to_numpy()
            wanted = sorted_distinct(ids[ids >= 0])
            Path("/proc/self/clear_refs").write_text("5")  # the driver's peak from here on
            tree.peak = 0
            started = time.perf_counter()
            ranges = range_count(len(wanted), section.tokenize_num_cpus)
            per_range = -(-len(wanted) // ranges)
            bounds = wanted[per_range::per_range]
            if arm == "ranges":
                source = TextColumns(blocks, [("text", "id")], [ids], block_rows)
                out = distinct_texts([source], wanted, section.tokenize_num_cpus).blocks
                ray.wait(out, num_returns=len(out), fetch_local=False)
            else:
                sorted_ds = (
                    ray.data.from_arrow_refs(blocks)
                    .select_columns(["id", "text"])
                    .filter(expr="id >= 0")
                    .sort("id", boundaries=bounds.tolist())
                    .map_batches(_first_of_each_id, batch_format="pyarrow", batch_size=None)
                )
                out = list(sorted_ds.materialize().to_arrow_refs())
            seconds = time.perf_counter() - started
        driver = status_bytes(os.getpid(), "VmHWM")
        tables = ray.get(out)
        got = np.concatenate([t.column("id").to_numpy() for t in tables])
        firsts = [int(t.column("id")[0].as_py()) for t in tables if t.num_rows]
        texts = {
            int(i): s
            for t in tables[:2]
            for i, s in zip(t.column("id").to_numpy(), t.column("text").to_pylist(), strict=True)
        }
    return {
        "arm": arm, "rows": int(len(ids)), "distinct": int(len(wanted)), "ranges": len(firsts),
        "seconds": seconds, "driver_peak": driver, "worker_peak": tree.peak,
        "ids_in_order": bool(np.array_equal(got, wanted)), "firsts": firsts[:8],
        "sample": {str(k): v for k, v in list(texts.items())[:50]},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--sizes", default="1000000", help="corpus sizes (lines), comma-separated")
    parser.add_argument("--arms", default="ranges,ray-sort")
    parser.add_argument("--arena", default="0", help="MALLOC_ARENA_MAX values (0: unset), comma-separated")
    parser.add_argument("--direct-call-bytes", type=int, default=0,
                        help="RAY_max_direct_call_object_size (0: Ray's default, 100 KB)")  # fmt: skip
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = BENCHMARK.parse(parser, argv)
    if args.arm:
        print(RESULT + json.dumps(run_arm(args.corpus, args.arm)), flush=True)
        return 0
    rows_list = [int(r) for r in args.sizes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="text-sort-") as workdir:
        for rows in rows_list:
            corpus = Path(workdir) / f"corpus-{rows}.txt"
            write_corpus(corpus, rows)
            for arena in [int(a) for a in args.arena.split(",")]:
                for arm in args.arms.split(","):
                    env = dict(os.environ)
                    env.pop("MALLOC_ARENA_MAX", None)
                    if arena:
                        env["MALLOC_ARENA_MAX"] = str(arena)
                    if args.direct_call_bytes:
                        env["RAY_max_direct_call_object_size"] = str(args.direct_call_bytes)
                    proc = subprocess.run(
                        [sys.executable, "-m", BENCHMARK.module, "--arm", arm, "--corpus", str(corpus)],
                        env=env, capture_output=True, text=True, timeout=3600,
                    )  # fmt: skip
                    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
                    if line is None:
                        print(
                            f"{arm} at {rows:,} rows failed:\n{(proc.stdout + proc.stderr)[-3000:]}",
                            flush=True,
                        )
                        continue
                    result = {**json.loads(line[len(RESULT) :]), "arena": arena}
                    results.append(result)
                    print(json.dumps({k: v for k, v in result.items() if k != "sample"}), flush=True)
    print(table(results))
    print(machine_report("ray", "pyarrow"))
    return 0


def table(results: list[dict[str, Any]]) -> str:
    """One row an arm: seconds, peaks, and its ratio to ``ranges`` at the same size and arena."""
    mib = 2**20
    lines = ["| rows | distinct | MALLOC_ARENA_MAX | arm | seconds | vs ranges | driver peak MiB | "
             "largest other process MiB | same ids, ranges, texts |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        base = next((b for b in results if b["arm"] == "ranges" and b["rows"] == r["rows"] and b["arena"] == r["arena"]), None)  # fmt: skip
        same = (
            base is not None
            and r["firsts"] == base["firsts"]
            and r["ids_in_order"]
            and all(base["sample"].get(k, v) == v for k, v in r["sample"].items())
        )
        ratio = f"{r['seconds'] / base['seconds']:.2f}x" if base else ""
        lines.append(
            f"| {r['rows']:,} | {r['distinct']:,} | {r['arena'] or 'unset'} | {r['arm']} | {r['seconds']:.1f} | {ratio} | "
            f"{r['driver_peak'] / mib:,.0f} | {r['worker_peak'] / mib:,.0f} | {'yes' if same else 'NO'} |"
        )  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
