"""What the corpus task's miner holds of the plan, in bytes a row (issue 72, item 2): the Python
heap one refresh adds at its peak, and what it keeps between refreshes, measured with
``tracemalloc`` (numpy's arrays included; faiss' index is not, and is the same on both sides).

    python -m bench.miner_plan_memory --rows 250000,500000

``--rows`` unit vectors of ``--dim`` dimensions around 64 centres, every text distinct, IVF
search, ``top_k`` 4 and partitions of ``--partition-rows`` rows: a partition's neighbour lists
are small, so what grows with the corpus is what a refresh holds of every row. Two refreshes
run as the miner runs them, the second measured: it holds the first's report for the churn,
and writes its plan to a run-storage folder. The commit before this bench wrote the plan whole
after planning (``write_mined``); run this file with that commit's ``pipeline`` first on the
``PYTHONPATH`` to measure it side by side (the same command, the table's ``commit`` column).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from bench.embedded_texts import EmbeddedTexts
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.mining.planning import PlanSettings, refresh_corpus

MIB = 2**20


def clustered_vectors(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, dim)).astype(np.float32)
    vectors = centres[rng.integers(0, 64, rows)] + 0.5 * rng.standard_normal((rows, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def measure(rows: int, dim: int, partition_rows: int, folder: str) -> dict[str, float]:
    """Two refreshes of one corpus, the second traced: its peak above what was held before it,
    and what stays held after it (its report, as the miner keeps it), in bytes."""
    import pipeline.training.plan_source as plan_source

    search = SearchSettings(top_k=4, index=IndexSpec("ivf"))
    settings = MinerSettings(
        pooler="mean", batch_size=64, seed=0, search=search, filters=NegativeFilters(range_min=0),
        plan=PlanSettings("random"), partition_rows=partition_rows, mined_dir=folder,
    )  # fmt: skip
    vectors = clustered_vectors(rows, dim)
    keys = np.arange(rows)

    def refresh(version: int, previous):  # noqa: ANN001, ANN202
        texts = EmbeddedTexts(vectors, None, search, seed=version)
        report = refresh_corpus(texts, keys=keys, settings=settings, version=version, previous=previous)
        if report.plan is not None:  # the commit before: the miner wrote the whole plan after planning
            plan_source.write_mined(folder, f"v{version}-plan.npz", plan=report.plan)
        return report

    first = refresh(1, None)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    second = refresh(2, first)
    seconds = time.perf_counter() - started
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del first  # the miner keeps only the last report
    return {
        "peak": peak - before,
        "kept": after - before,
        "seconds": seconds,
        "partitions": second.metrics["mining/partitions"],
        "churn": second.metrics["mining/churn"],
    }


def commit_of(module_file: str) -> str:
    folder = Path(module_file).parent
    found = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    import argparse

    import pipeline

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="250000,500000", help="corpus sizes, comma-separated")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--partition-rows", type=int, default=25_000)
    args = parser.parse_args(argv)
    sizes = [int(r) for r in args.rows.split(",")]
    results = []
    for rows in sizes:
        with tempfile.TemporaryDirectory() as folder:
            results.append(measure(rows, args.dim, args.partition_rows, folder))
    commit = commit_of(pipeline.__file__)
    print("| commit | rows | partitions | refresh peak MiB | kept after MiB | churn | refresh s |")
    print("|---|---|---|---|---|---|---|")
    for rows, r in zip(sizes, results, strict=True):
        print(
            f"| {commit} | {rows:,} | {r['partitions']:.0f} | {r['peak'] / MIB:.1f} | {r['kept'] / MIB:.1f} | "
            f"{r['churn']:.4f} | {r['seconds']:.1f} |"
        )
    if len(sizes) > 1:
        # What grows with the corpus: the slope between the smallest and largest, in bytes a row
        # (the partition's lists and the sampled similarities are the same at every size).
        added = sizes[-1] - sizes[0]
        peak = (results[-1]["peak"] - results[0]["peak"]) / added
        kept = (results[-1]["kept"] - results[0]["kept"]) / added
        print(f"| {commit} | per row added | | {peak:.1f} B | {kept:.1f} B | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
