"""What the corpus task's miner holds of the plan, in bytes a row (issue 72, item 2): the Python
heap one refresh adds at its peak, and what it keeps between refreshes, measured with
``tracemalloc`` (numpy's arrays included; faiss' index is not, and is the same on both sides).

    python -m bench.miner_plan_memory --rows 250000,500000
    python -m bench.miner_plan_memory --rows 50000,150000 --shards 2 --partition-rows 20000

``--rows`` unit vectors of ``--dim`` dimensions around 64 centres, every text distinct, IVF
search, ``top_k`` 4 and partitions of ``--partition-rows`` rows: a partition's neighbour lists
are small, so what grows with the corpus is what a refresh holds of every row. Two refreshes
run as the miner runs them, the second measured: it holds the first's report for the churn,
and writes its plan to a run-storage folder. The commit before this bench wrote the plan whole
after planning (``write_mined``); run this file with that commit's ``pipeline`` first on the
``PYTHONPATH`` to measure it side by side (the same command, the table's ``commit`` column).

``--shards S`` (2 or more) measures the miner as the job runs it instead: a
:class:`~pipeline.mining.miner.HardNegativeMiner` in this process over S shard actors on a local
Ray, a generated corpus (:func:`bench.scale.prepare`) tokenized into the object store as the job
does, encoded by the tiny random-weights model, flat search, the plans written to a run-storage
folder as the job writes them. The shards hold the texts, vectors
and whatever the refresh leaves to them in processes of their own, so the traced heap is the
miner's alone: what it holds from its start (``start``), and the second refresh's peak and
what it keeps after it.
"""

from __future__ import annotations

import inspect
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.negatives import NegativeFilters
from pipeline.mining.planning import refresh_corpus

MIB = 2**20
WARM_UP_ROWS = 10_000


def clustered_vectors(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, dim)).astype(np.float32)
    vectors = centres[rng.integers(0, 64, rows)] + 0.5 * rng.standard_normal((rows, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def measure(rows: int, dim: int, partition_rows: int, folder: str) -> dict[str, float]:
    """Two refreshes of one corpus, the second traced: its peak above what was held before it,
    and what stays held after it (its report, as the miner keeps it), in bytes."""
    import pipeline.training.plan_source as plan_source
    from bench.embedded_texts import EmbeddedTexts  # deferred: --shards measures a commit without it

    search = SearchSettings(top_k=4, index=IndexSpec("ivf"))
    settings = MinerSettings(
        pooler="mean", batch_size=64, seed=0, search=search, filters=NegativeFilters(range_min=0),
        batch_sampler="random", partition_rows=partition_rows, mined_dir=folder,
    )  # fmt: skip
    vectors = clustered_vectors(rows, dim)

    # Commits before 2026-12-03 (session 45) took the last report whole as ``previous``.
    takes_version = "previous_version" in inspect.signature(refresh_corpus).parameters

    def refresh(version: int, previous):  # noqa: ANN001, ANN202
        texts = EmbeddedTexts(vectors, None, search, seed=version)
        last = (
            {"previous_version": previous and previous.version} if takes_version else {"previous": previous}
        )
        report = refresh_corpus(texts, settings=settings, version=version, **last)
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


def measure_miner(rows: int, shards: int, partition_rows: int, workdir: Path) -> dict[str, float]:
    """The miner of the job, over ``shards`` shard actors: its traced heap from its start, and
    the second of two refreshes (peak above, and kept after, what it held before it)."""
    import ray

    from bench.scale import prepare
    from pipeline.config.data_section import DataSection
    from pipeline.config.loading import load_config
    from pipeline.data.corpus import load_clean_corpus
    from pipeline.data.tokenize import tokenize_texts
    from pipeline.mining.miner import HardNegativeMiner
    from pipeline.model.folders import load_tokenizer, pack_dir
    from pipeline.runtime.cluster import ray_session

    corpus, model = prepare(workdir, rows)
    with ray_session(load_config(None, [f"ray.num_cpus={shards + 2}"])):
        section = DataSection(path=str(corpus), max_seq_len=32)
        distinct, _ = load_clean_corpus(section)
        blocks, _ = tokenize_texts(distinct, load_tokenizer(model), section)
        del distinct
        # Batches of 16: the in-batch sample's 2,000 batches are whole below 32,000 rows, so
        # at both sizes it is the same size and the slope is what grows with the rows.
        settings = MinerSettings(
            pooler="mean", batch_size=16, seed=0, search=SearchSettings(top_k=8, index=IndexSpec("flat")),
            filters=NegativeFilters(range_min=0), batch_sampler="random", partition_rows=partition_rows,
            shards=shards, num_cpus=0.5, mined_dir=str(workdir / "mined"),
        )  # fmt: skip
        model_blob = ray.put(pack_dir(model))
        tracemalloc.start()
        miner = HardNegativeMiner(blocks, model_blob, settings)
        start = tracemalloc.get_traced_memory()[0]
        try:
            miner.refresh(None, 1, 0)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            started = time.perf_counter()
            report = miner.refresh(None, 2, 0)
            seconds = time.perf_counter() - started
            after, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            miner.shards.stop()
    return {
        "rows": float(blocks.num_rows),
        "start": start,
        "peak": peak - before,
        "kept": after - start,
        "seconds": seconds,
        "partitions": report.metrics["mining/partitions"],
        "churn": report.metrics["mining/churn"],
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
    parser.add_argument("--shards", type=int, default=0, help="2 or more: the job's miner over shard actors")
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench-miner-memory"))
    args = parser.parse_args(argv)
    sizes = [int(r) for r in args.rows.split(",")]
    results = []
    if args.shards >= 2:
        # Once at a small size, untraced: the modules a refresh imports on first use would
        # count in the first size's heap.
        args.workdir.mkdir(parents=True, exist_ok=True)
        measure_miner(WARM_UP_ROWS, args.shards, WARM_UP_ROWS // 3, args.workdir)
    for rows in sizes:
        if args.shards >= 2:
            results.append(measure_miner(rows, args.shards, args.partition_rows, args.workdir))
            continue
        with tempfile.TemporaryDirectory() as folder:
            results.append(measure(rows, args.dim, args.partition_rows, folder))
    sizes = [int(r.get("rows", rows)) for rows, r in zip(sizes, results, strict=True)]
    commit = commit_of(pipeline.__file__)
    print(
        "| commit | rows | partitions | held from start MiB | refresh peak MiB | kept after MiB | churn | refresh s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for rows, r in zip(sizes, results, strict=True):
        print(
            f"| {commit} | {rows:,} | {r['partitions']:.0f} | {r.get('start', 0) / MIB:.1f} | "
            f"{r['peak'] / MIB:.1f} | {r['kept'] / MIB:.1f} | {r['churn']:.4f} | {r['seconds']:.1f} |"
        )
    if len(sizes) > 1:
        # What grows with the corpus: the slope between the smallest and largest, in bytes a row
        # (the partition's lists and the sampled similarities are the same at every size).
        added = sizes[-1] - sizes[0]
        slope = {
            key: (results[-1].get(key, 0) - results[0].get(key, 0)) / added
            for key in ("start", "peak", "kept")
        }
        print(
            f"| {commit} | per row added | | {slope['start']:.1f} B | {slope['peak']:.1f} B | {slope['kept']:.1f} B | | |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
