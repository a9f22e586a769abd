"""The corpus task's planner at 1, 2 and 4 ways (issue 72, item 4): the seconds
:class:`~pipeline.mining.planning.PartitionPlanner` takes to plan every partition of one corpus
refresh from its rows' neighbour lists, with no model, no encode and no search in the way.

    python -m bench.partition_planner --rows 1000000 --ways 1,2,4

The refresh's own settings (``jobs/configs/recipe-wiki-unsup.yaml``: ``knn`` batches of 64,
``top_k`` 64) and its partition size (:func:`~pipeline.mining.corpus_partitions.rows_per_partition`)
cut ``--rows`` corpus positions into partitions of the epoch's whole batches. Each row gets the
lists a search would give it: itself first (its duplicate), then 64 distinct rows of its own
cluster of 256 (near texts), a tenth of them swapped for rows anywhere in the corpus (neighbours
the partition does not hold), scores falling with rank and one row in a hundred with a
neighbour above the relative margin (a likely false negative to keep out of its batch). The
lists are made before the clock starts. Then, for each ``--ways``, a fresh
:class:`PartitionPlanner` plans every partition, as Ray tasks up to ``ways`` at once on a local
Ray of ``--cpus`` logical CPUs (1: in this process, as ``mining.shards: 1`` plans), and the
plan is checked equal to the first arm's (the planner's contract: the same plan at any
``ways``). On this 2-core machine ways beyond 2 share the cores, so what 4 ways gain is what
a miner with 4 shards' nodes would gain only on paper; the per-row rate at 1 way is what the
100M projection in docs/benchmarks.md reads.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, Benchmark, machine_report

BENCHMARK = Benchmark(__spec__.name, "Mining refresh over shards")
CONFIG = REPO / "jobs" / "configs" / "recipe-wiki-unsup.yaml"
CLUSTER_ROWS = 256
OUTSIDE_SHARE = 0.1
NEAR_POSITIVE_SHARE = 0.01


def neighbour_lists(rows: np.ndarray, corpus: int, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Search-like lists for a partition's sorted ``rows``: ``indices`` and ``scores`` ``(m, k)``,
    each row itself first, and ``duplicate`` (the row's own text)."""
    m = len(rows)
    order = rng.permutation(m)
    indices = np.empty((m, k), dtype=np.int64)
    for lo in range(0, m, CLUSTER_ROWS):
        members = order[lo : lo + CLUSTER_ROWS]
        # Each member's nearest: the others of its cluster, in a random order of its own.
        picks = np.argsort(rng.random((len(members), len(members))), axis=1)
        picks = picks[picks != np.arange(len(members))[:, None]].reshape(len(members), -1)[:, : k - 1]
        indices[members, 0] = rows[members]
        indices[members, 1 : 1 + picks.shape[1]] = rows[members[picks]]
        indices[members, 1 + picks.shape[1] :] = rng.integers(
            0, corpus, (len(members), k - 1 - picks.shape[1])
        )
    outside = rng.random((m, k)) < OUTSIDE_SHARE
    outside[:, 0] = False
    indices[outside] = rng.integers(0, corpus, int(outside.sum()))
    scores = np.sort(rng.uniform(0.3, 0.9, (m, k)).astype(np.float32), axis=1)[:, ::-1].copy()
    scores[:, 0] = 1.0
    near = rng.random(m) < NEAR_POSITIVE_SHARE
    scores[near, 1] = 0.99
    return {"indices": indices, "scores": scores, "duplicate": indices == rows[:, None]}


def partitions_of(rows: int, settings: Any) -> list[Any]:
    """The corpus' partitions as a refresh cuts them (``ceil(rows / partition_rows)`` of them,
    ``settings.partition_rows`` or the refresh's :func:`rows_per_partition`, their edges moved
    to the epoch's batch bounds by the refresh's own
    :func:`~pipeline.mining.corpus_partitions.cut_at_batch_bounds`), each row put in a random one
    of even size instead of its nearest centroid's: no vectors here."""
    from pipeline.batching.plan import balanced_batch_sizes
    from pipeline.mining.corpus_partitions import (
        CorpusPartitions,
        RankedRows,
        cut_at_batch_bounds,
        rank_offsets,
        rows_per_partition,
    )

    most = settings.partition_rows or rows_per_partition(settings.search.top_k + 1)
    assignment = np.random.default_rng(0).permutation(rows) % -(-rows // most)
    counts = np.bincount(assignment)
    sizes = balanced_batch_sizes(rows, settings.batch_size)
    ranked = RankedRows(assignment, 0, rank_offsets(counts[None, :])[0])
    return list(CorpusPartitions(*cut_at_batch_bounds(counts, sizes), sizes, ranked.between))


def plan_all(
    partitions: list[Any], lists: list[dict[str, np.ndarray]], settings: Any, ways: int
) -> tuple[float, Any]:
    """Every partition planned by one :class:`PartitionPlanner` of ``ways``: the seconds, and
    the plans joined as the refresh joins them."""
    from pipeline.batching.plan import BatchPlan
    from pipeline.mining.planning import PartitionPlanner, partition_seed

    started = time.perf_counter()
    planner = PartitionPlanner(ways=ways, label_selector={})
    for number, (partition, found) in enumerate(zip(partitions, lists, strict=True)):
        planner.submit(
            partition, **found, settings=settings, seed=partition_seed(settings.seed, number), version=1
        )
    plans = [plan for plan, _ in planner.finished(wait=True)]
    seconds = time.perf_counter() - started
    joined = BatchPlan(1, np.concatenate([p.rows for p in plans]), np.concatenate([p.sizes for p in plans]))
    return seconds, joined


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="corpus positions (default 1,000,000)")
    parser.add_argument(
        "--ways", default="1,2,4", help="comma-separated PartitionPlanner ways (default 1,2,4)"
    )
    parser.add_argument("--cpus", type=int, default=4, help="the local Ray's logical CPUs (default 4)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each ways, the median reported (default 1)"
    )
    args = BENCHMARK.parse(parser, argv)
    ways = [int(w) for w in args.ways.split(",")]

    from pipeline.config.loading import load_config
    from pipeline.mining.miner_settings import MinerSettings
    from pipeline.runtime.cluster import ray_session

    settings = MinerSettings.from_config(load_config(CONFIG, []))
    partitions = partitions_of(args.rows, settings)
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    lists = [neighbour_lists(p.rows, args.rows, settings.search.top_k + 1, rng) for p in partitions]
    print(f"[planner] {len(partitions)} partitions of up to {len(partitions[0].rows):,} rows; lists made in "
          f"{time.perf_counter() - started:.1f}s", flush=True)  # fmt: skip
    results = []
    with ray_session(load_config(None, [f"ray.num_cpus={args.cpus}"])):
        first = None
        for way in ways:
            runs = [plan_all(partitions, lists, settings, way) for _ in range(args.repeats)]
            seconds = statistics.median(s for s, _ in runs)
            plan = runs[0][1]
            first = first or plan
            same = np.array_equal(plan.rows, first.rows) and np.array_equal(plan.sizes, first.sizes)
            results.append({"ways": way, "seconds": seconds, "same": same})
            print(f"[planner] ways {way}: {seconds:.1f}s, same plan as ways {ways[0]}: {same}", flush=True)
    table = planner_table(args.rows, len(partitions), results)
    print(table)
    if args.append is not None:
        BENCHMARK.append(f"The corpus planner at {args.ways} ways, {args.rows:,} rows", machine_report(), table, Path(args.append), argv)  # fmt: skip
    return 0 if all(r["same"] for r in results) else 1


def planner_table(rows: int, partitions: int, results: list[dict[str, Any]]) -> str:
    """One row a ``ways``: seconds, seconds per 1M rows, speed against the first row's."""
    lines = [
        "| rows | partitions | ways | plan s | s per 1M rows | speed-up | same plan |",
        "|---|---|---|---|---|---|---|",
    ]
    base = results[0]["seconds"]
    for r in results:
        lines.append(
            f"| {rows:,} | {partitions} | {r['ways']} | {r['seconds']:.1f} | {r['seconds'] / rows * 1e6:.1f} | "
            f"{base / r['seconds']:.2f}x | {'yes' if r['same'] else 'NO'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
