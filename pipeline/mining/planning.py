"""The corpus task's refresh: from the k-NN lists to the next epoch's plan.

The miner filters every row's neighbours (duplicates and likely false negatives out) and groups
the rows into batches, one partition of near texts at a time
(:mod:`~pipeline.mining.corpus_partitions`), with the sampler ``mining.batch_sampler`` names,
each row's flagged false negatives kept out of its batch; with shards, the partitions are
planned in parallel where the shards are (:class:`PartitionPlanner`). One place decides it, so a new
sampler is one entry in :mod:`pipeline.batching.registry` plus its function in
``pipeline/batching``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.batching.plan import BatchPlan, balanced_batch_sizes
from pipeline.batching.registry import build_plan
from pipeline.batching.sampler_inputs import SamplerInputs
from pipeline.data.plan_file import PlanFileWriter
from pipeline.mining.corpus_partitions import CorpusPartition, partition_corpus, rows_per_partition
from pipeline.mining.encoded_texts import EncodedTexts
from pipeline.mining.index import estimate_index_bytes, index_summary
from pipeline.mining.negatives import filter_candidates
from pipeline.mining.plan_quality import CandidateTotals, PlanQuality
from pipeline.mining.refresh_report import RefreshReport
from pipeline.mining.text_keys import duplicate_mask

SEARCH_CHUNK_ROWS = 65_536
"""Queries searched at once (the shards answer a chunk at a time)."""

if TYPE_CHECKING:
    from pipeline.mining.miner_settings import MinerSettings


def refresh_corpus(
    texts: EncodedTexts,
    *,
    settings: MinerSettings,
    version: int,
    previous_version: int | None,
) -> RefreshReport:
    """The corpus task's refresh, after the encode: cut the corpus into partitions of near
    texts, then for each search its rows against the corpus, filter their neighbours and plan
    its batches; the batches of every partition, shuffled, are the next epoch's plan.

    Each partition's batches are written out (``settings.mined_dir``'s ``v<N>-plan.parquet``,
    :mod:`~pipeline.data.plan_file`) and measured as soon as they are planned; their shuffle
    is drawn here and applied where the file is read, so this process never holds the whole
    plan.

    Args:
        texts: the corpus under the newest weights, every text a candidate (the miner's
            shards, which hold each row's key and partition: this process holds neither).
        settings: search, filters, sampler, batch size, partition size, seed, where to write.
        version: this refresh's version (it seeds the search and the plan).
        previous_version: the last refresh's version, for the churn (the texts' holders keep
            each row's batch under its version); None: no churn.

    Returns:
        The report with ``mined``, the plan's URI (without ``mined_dir``: ``plan``, the plan
        itself).
    """
    s = settings
    n, seed = texts.rows, s.seed + version
    # Each row finds itself first, which the filter drops.
    k = min(s.search.top_k + 1, n)
    partition_rows = s.partition_rows or rows_per_partition(k)
    estimate = estimate_index_bytes(n, texts.dim, k, texts.kind, queries=min(n, partition_rows))
    print(f"[mining] v{version}: {index_summary(texts.kind, n, texts.dim, k, estimate)}", flush=True)
    started = time.perf_counter()
    sizes = balanced_batch_sizes(n, s.batch_size)
    partitions = partition_corpus(texts, sizes=sizes, partition_rows=partition_rows, seed=seed)
    seconds = {"partition": time.perf_counter() - started, "search": 0.0, "plan": 0.0}
    # One partition is the unpartitioned plan, in the sampler's order; more are shuffled together.
    reorder = seed if len(partitions) > 1 else None
    order = (
        np.arange(len(sizes)) if reorder is None else np.random.default_rng(reorder).permutation(len(sizes))
    )
    quality = PlanQuality(
        texts, num_batches=len(sizes), order=order, seed=s.seed, version=version,
        previous=previous_version,
    )  # fmt: skip
    uri = f"{s.mined_dir.rstrip('/')}/v{version}-plan.parquet" if s.mined_dir else None
    written = PlanFileWriter(uri, sampler=s.batch_sampler, reorder=reorder, corpus_rows=n)
    totals = CandidateTotals()

    def write(planned: Iterable[tuple[BatchPlan, CandidateTotals]]) -> None:
        for plan, part in planned:
            written.write(plan)
            quality.add(plan)
            totals.add(part)

    planner = PartitionPlanner(ways=s.shards, label_selector=s.label_selector)
    for number, partition in enumerate(partitions):
        started = time.perf_counter()
        scores, indices = search_rows(texts, partition.rows, k)
        duplicate = same_text(texts, partition.rows, indices)
        seconds["search"] += time.perf_counter() - started
        started = time.perf_counter()
        planner.submit(
            partition, scores=scores, indices=indices, duplicate=duplicate, settings=s,
            seed=partition_seed(seed, number), version=version,
        )  # fmt: skip
        write(planner.finished(wait=False))
        seconds["plan"] += time.perf_counter() - started
        del scores, indices, duplicate
    started = time.perf_counter()
    write(planner.finished(wait=True))
    mined = written.close(version)
    seconds["plan"] += time.perf_counter() - started
    # Measure: how hard and how safe the plan is, against random pairs of rows.
    metrics, similarities = quality.metrics()
    metrics = {
        "mining/index_s": texts.build_seconds,
        "mining/partition_s": seconds["partition"],
        "mining/search_s": seconds["search"],
        "mining/plan_s": seconds["plan"],
        "mining/corpus_size": float(n),
        "mining/index_estimated_mib": estimate / 2**20,
        **totals.metrics(),
        **metrics,
    }
    return RefreshReport(
        version, metrics, plan=mined if isinstance(mined, BatchPlan) else None,
        mined=mined if isinstance(mined, str) else None, similarities=similarities,
    )  # fmt: skip


def search_rows(texts: EncodedTexts, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(len(rows), k)`` scores and corpus positions of the rows' nearest texts, searched a
    chunk of queries at a time (the shards answer a chunk at a time)."""
    found = [texts.search_positions(rows[lo : lo + SEARCH_CHUNK_ROWS], k)
             for lo in range(0, len(rows), SEARCH_CHUNK_ROWS)]  # fmt: skip
    scores, positions = zip(*found, strict=True)
    return np.concatenate(scores), np.concatenate(positions)


def same_text(texts: EncodedTexts, rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``(m, k)`` True where a found text (``indices``, -1: none) has the key of its row's
    text (:func:`~pipeline.mining.text_keys.duplicate_mask`), the keys asked of the texts'
    holders once for each distinct text found."""
    found = indices >= 0
    asked, slot = np.unique(indices[found], return_inverse=True)
    candidates = np.full(indices.shape, -1, dtype=np.int64)
    candidates[found] = slot
    row_keys = texts.keys_of(rows)
    return duplicate_mask(candidates, row_keys, row_keys, texts.keys_of(asked))


class PartitionPlanner:
    """Plans each partition as soon as its search is done: in this process (``ways`` 1), or
    as Ray tasks, up to ``ways`` at once, on nodes ``label_selector`` matches (where the shards
    are), while the next partitions are searched. A task reserves no CPU of its own: it runs
    on what the miner and its shards reserved, which wait for it. Each partition is seeded by
    its number, so the plan and its totals are the same at any ``ways``."""

    def __init__(self, ways: int, label_selector: dict[str, str]):
        self.ways = ways
        self._waiting: list[Any] = []
        """The partitions not yet handed on: each one's plan and totals, or the object ref of
        the task making them."""
        self._running: list[Any] = []
        """The refs of the tasks still planning, at most ``ways``."""
        if ways > 1:
            import ray  # deferred: one way plans in this process

            self._task = ray.remote(num_cpus=0, label_selector=label_selector or None)(plan_partition)

    def submit(self, partition: CorpusPartition, **kwargs: Any) -> None:
        """Plan ``partition`` (:func:`plan_partition`'s other arguments by keyword), once fewer
        than ``ways`` partitions are being planned."""
        if self.ways == 1:
            self._waiting.append(plan_partition(partition, **kwargs))
            return
        import ray

        while len(self._running) >= self.ways:
            _, self._running = ray.wait(self._running, num_returns=1)
        self._waiting.append(self._task.remote(partition, **kwargs))
        self._running.append(self._waiting[-1])

    def finished(self, *, wait: bool) -> Iterator[tuple[BatchPlan, CandidateTotals]]:
        """The partitions planned since last asked, each plan and its totals, in partition
        order: those done so far, or (``wait``) every one submitted. Each is handed on as it
        comes, so that the caller holds one partition's plan at a time."""
        while self._waiting:
            head = self._waiting[0]
            if self.ways > 1:
                import ray

                if not wait and not ray.wait([head], timeout=0)[0]:
                    return
                head = ray.get(head)
            self._waiting.pop(0)
            yield head


def plan_partition(
    partition: CorpusPartition,
    *,
    scores: np.ndarray,
    indices: np.ndarray,
    duplicate: np.ndarray,
    settings: MinerSettings,
    seed: int,
    version: int,
) -> tuple[BatchPlan, CandidateTotals]:
    """One partition's batches, from its rows' neighbours over the whole corpus.

    Duplicates of a row's text and likely false negatives leave its candidates (each row is
    its own positive, unsupervised: the relative margin is against 1.0); the neighbours in the
    partition are what the sampler groups, each row's flagged false negatives kept out of its
    batch.

    Args:
        partition: the rows and the batch sizes to cut them into.
        scores, indices: ``(m, k)`` the rows' search over the corpus (:func:`search_rows`).
        duplicate: ``(m, k)`` the candidate is the row's own text (by key).
        settings: filters and sampler.
        seed: seeds the sampler.
        version: recorded in the plan.

    Returns:
        The partition's batches, in corpus positions, and its counts.
    """
    rows, m = partition.rows, len(partition.rows)
    filtered = filter_candidates(
        indices, scores, np.ones(m, dtype=np.float32), duplicate=duplicate, filters=settings.filters
    )
    # The sampler numbers the partition's rows 0..m-1; a neighbour in another partition is dropped.
    local = np.minimum(np.searchsorted(rows, indices), m - 1)
    inside = (indices >= 0) & (rows[local] == indices)
    itself = indices == rows[:, None]
    false_negatives = np.where(filtered.false_negative & ~itself & inside, local, -1)
    neighbours = np.where(filtered.allowed & inside, local, -1)
    inputs = SamplerInputs(
        neighbours, scores, false_negatives, settings.batch_size, seed, version, sizes=partition.sizes
    )
    plan = build_plan(settings.batch_sampler, inputs)
    totals = CandidateTotals.of_partition(
        rows=rows, scores=scores, indices=indices, filtered=filtered, inside=inside,
        false_negatives=false_negatives, plan=plan,
    )  # fmt: skip
    return replace(plan, rows=rows[plan.rows]), totals


def partition_seed(seed: int, number: int) -> int:
    """The sampler's seed for partition ``number``: the refresh's own for the first (so that one
    partition plans as an unpartitioned corpus), one drawn from both for the others."""
    return seed if number == 0 else int(np.random.SeedSequence([seed, number]).generate_state(1)[0])
