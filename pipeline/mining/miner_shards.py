"""The miner's S shards, asked as one: every shard encodes its texts, the vectors of any
positions come from the shards that hold them, and a search runs on every shard with the top
lists merged (:func:`~pipeline.mining.index.merge_top_k`).

With ``mining.shards: 1`` the one shard is the same :class:`~pipeline.mining.miner_shard.MinerShard`
run in the miner's own process (:class:`InProcessShard`): a laptop's run keeps one mining
process, and a refresh reads the same at any S.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch

from pipeline.core.errors import actor_lost_errors, first_line
from pipeline.core.seams import actor_runtime_env
from pipeline.data.tokenized import TokenizedBlocks
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import (
    INDEX_KINDS,
    PQ_TRAIN_ROWS,
    calibrate_nprobe,
    calibration_rows,
    index_over_cells,
    ivf_cells,
    merge_top_k,
    training_rows,
)
from pipeline.mining.ivf_training import spherical_kmeans
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.miner_shard import MinerShard, ShardRange, shard_ranges
from pipeline.model.teacher import TeacherSettings


class MinerShards:
    """Handles of :class:`~pipeline.mining.miner_shard.MinerShard` actors over consecutive
    ranges of the corpus. After :meth:`encode`, the
    :class:`~pipeline.mining.encoded_texts.EncodedTexts` a refresh reads: the vectors of any
    positions and a search over every shard's candidates.

    Args:
        handles: the shard actors (or the one :class:`InProcessShard`), in range order.
        spans: the range each holds.
        launch: starts a shard actor for a range (a lost shard's replacement).
        search: the index kind and device (where IVF's shared cells are trained).
    """

    def __init__(
        self,
        handles: list[Any],
        spans: list[ShardRange],
        launch: Callable[[ShardRange], Any],
        search: SearchSettings,
    ):
        self.handles, self.spans, self.launch, self.search_settings = handles, spans, launch, search
        self.in_process = isinstance(handles[0], InProcessShard)
        self.firsts = np.array([span.first for span in spans], dtype=np.int64)
        self.first_candidates = np.array([span.first_candidate for span in spans], dtype=np.int64)
        self.rows = sum(span.count for span in spans)
        self.backend, self.kind, self.dim = "", "", 0
        self.build_seconds = 0.0
        self.nprobe = 0
        """IVF cells every shard probes a query (0: a flat index)."""
        self.centroids: np.ndarray | None = None
        """The shared IVF cells of the last refresh that trained them: ``(cells, d)``."""

    @classmethod
    def start(
        cls,
        blocks: TokenizedBlocks,
        model_blob: Any,
        *,
        pooler: str,
        candidates: np.ndarray | None,
        shards: int,
        search: SearchSettings,
        actor_options: dict[str, Any],
        teacher: TeacherSettings | None = None,
        teacher_blob: Any = None,
    ) -> MinerShards:
        """Start ``shards`` actors (each with ``actor_options``: CPUs, GPUs, node labels), each
        taking its range's rows from ``blocks``; one shard runs in this process, on what the
        miner reserved.

        Args:
            blocks: the tokenized corpus in the object store.
            model_blob: the packed model folder, or its object ref.
            pooler: ``model.pooler``.
            candidates: sorted corpus positions searches may return; None: every text.
            shards: how many.
            search: the index kind and device.
            actor_options: Ray options of every shard actor.
            teacher: the teacher every shard loads (:meth:`score_indexed`); None: none.
            teacher_blob: its packed folder, or that folder's object ref; None: each shard
                reads ``teacher.model`` on its node.
        """
        spans = shard_ranges(blocks.num_rows, candidates, shards)
        if shards == 1:
            blob, teacher_blob = (
                ray.get(b) if isinstance(b, ray.ObjectRef) else b for b in (model_blob, teacher_blob)
            )
            shard = MinerShard(
                blocks,
                blob,
                pooler=pooler,
                span=spans[0],
                search=search,
                teacher=teacher,
                teacher_blob=teacher_blob,
            )
            return cls([InProcessShard(shard)], spans, lambda span: None, search)
        actor = ray.remote(MinerShard).options(**actor_options)
        if isinstance(teacher_blob, bytes):
            teacher_blob = ray.put(teacher_blob)  # once in the object store, not once per shard

        def launch(span: ShardRange) -> Any:
            return actor.remote(
                blocks, model_blob, pooler=pooler, span=span, search=search, teacher=teacher,
                teacher_blob=teacher_blob,
            )  # fmt: skip

        return cls([launch(span) for span in spans], spans, launch, search)

    def encode(self, encoder_state: dict[str, torch.Tensor] | None, seed: int) -> list[dict[str, Any]]:
        """Every shard encodes its texts with ``encoder_state`` (None: the model folder's weights
        they started with) and indexes its candidates, all at once, every one the same index
        kind. IVF shards share their cells: each first encodes its part of one sample
        (``seed``), the cells are trained on it by a k-means whose rounds every shard assigns
        its own part of, every shard lists its vectors under them, and one ``nprobe`` is
        calibrated for all (:func:`~pipeline.mining.index.calibrate_nprobe`). A query then
        scans the same lists in all as one index over every row would, however many shards
        hold them: with cells of their own, each shard would probe ``nprobe`` of its cells, and
        S shards scan about sqrt(S) times the lists one index scans.
        Returns each shard's report (rows, backend, seconds)."""
        started = time.perf_counter()
        state = self.to_every_shard(encoder_state)  # once in the object store, not once per shard
        # One kind for every shard, the most compact any of them needs (its rows or the memory
        # free where it runs may ask more than another's), so that IVF shards share their cells.
        kind = max(self._ask_every("index_kind", lambda n: ()), key=INDEX_KINDS.index)
        parts = shared_sample(self.first_candidates.tolist(), self.rows, seed=seed)
        if kind == "flat":  # trains nothing
            parts = [None] * len(parts)
        sampled = self._ask_every("encode_sample", lambda n: (state, seed, parts[n]))
        self.dim = sampled[0]["dim"]  # before the k-means, which asks the sample its dimension
        trained = None
        if kind != "flat":
            trained = self.to_every_shard(self._shared_cells(kind, [len(part) for part in parts], seed))
        reports = self._ask_every("encode", lambda n: (state, seed, kind, trained, parts[n]))
        for report, answer in zip(reports, sampled, strict=True):
            report["encode_seconds"] += answer["seconds"]
        self.backend = reports[0]["backend"] + (f" x{len(reports)}" if len(reports) > 1 else "")
        self.kind = reports[0]["kind"]
        if trained is not None:
            queries = self.vectors(self.positions_of(calibration_rows(self.rows, seed)))
            cells = len(self.centroids)
            self.nprobe, recall = calibrate_nprobe(self, queries, cells=cells)
            shards = len(self.handles)
            where = (
                f"over {shards} shards, {cells:,} cells in common" if shards > 1 else f"over {cells:,} cells"
            )
            print(
                f"[mining] {self.kind} {where}: "
                f"nprobe {self.nprobe:,} (recall@10 {recall:.3f} on {len(queries)} rows)",
                flush=True,
            )
        # Everything but the shards' encoding: the shared training, their builds, calibration.
        self.build_seconds = time.perf_counter() - started - max(r["encode_seconds"] for r in reports)
        return reports

    def _shared_cells(self, kind: str, sizes: list[int], seed: int) -> np.ndarray:
        """The empty index of ``kind`` every shard fills (:func:`~pipeline.mining.index.
        index_over_cells`), its cells kept in :attr:`centroids`. They are trained by a k-means
        whose every round each shard takes part in at once, assigning its own part of the
        sample (``sizes`` rows each) where it searches, on its GPU where it has one: only the
        centroids and the cells' sums travel. A shard lost meanwhile fails this refresh, and
        the next replaces it. IVF-PQ's codebooks train here, on rows drawn from every shard's
        part (the first rows would be the corpus' first)."""
        started = time.perf_counter()
        sample = SampleOverShards(self, sizes)
        self.centroids = spherical_kmeans(sample, ivf_cells(self.rows), seed=seed)
        each = ", each shard assigning its own" if len(self.handles) > 1 else ""
        print(
            f"[mining] {len(self.centroids):,} {kind} cells trained on {sample.count():,} rows{each}: "
            f"{time.perf_counter() - started:.1f}s",
            flush=True,
        )
        pq_sample = None
        if kind == "ivfpq":
            picks = np.random.default_rng(seed).choice(
                sample.count(), min(sample.count(), PQ_TRAIN_ROWS), replace=False
            )
            pq_sample = sample.get_subset(np.sort(picks))
        return index_over_cells(self.centroids, kind, pq_sample)

    def _ask_every(self, method: str, args_of: Callable[[int], tuple]) -> list[Any]:
        """Call ``method`` on every shard at once (``args_of(shard number)``) and gather the
        answers. A shard found dead (lost with its node or process, since the last refresh or
        in the one that failed) is replaced by a new actor over its range, which answers in its
        place: the miner goes on without a restart of its own."""
        pending = [getattr(handle, method).remote(*args_of(n)) for n, handle in enumerate(self.handles)]
        answers = []
        for number, ref in enumerate(pending):
            try:
                answers.append(self._fetch([ref])[0])
            except actor_lost_errors() as lost:
                span = self.spans[number]
                print(
                    f"[mining] shard {number} (rows {span.first}-{span.last - 1}) was lost "
                    f"({first_line(lost)}); a new shard takes its rows",
                    flush=True,
                )
                ray.kill(self.handles[number])  # already gone, unless it only failed to answer
                self.handles[number] = self.launch(span)
                answers.append(ray.get(getattr(self.handles[number], method).remote(*args_of(number))))
        return answers

    def positions_of(self, ordinals: np.ndarray) -> np.ndarray:
        """The corpus positions of candidates numbered ``ordinals`` among every shard's."""
        ordinals = np.asarray(ordinals, dtype=np.int64)
        owner = np.searchsorted(self.first_candidates, ordinals, side="right") - 1
        positions = np.empty_like(ordinals)
        for s, span in enumerate(self.spans):
            mine = owner == s
            positions[mine] = span.positions(ordinals[mine] - span.first_candidate)
        return positions

    def holders(self, positions: np.ndarray) -> np.ndarray:
        """The number of the shard that holds each of the corpus ``positions``."""
        return np.searchsorted(self.firsts, positions, side="right") - 1

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        """``(len(positions), dim)`` vectors of any corpus positions, in their order, each
        from the shard that holds it."""
        positions = np.asarray(positions, dtype=np.int64)
        return self.rows_from_owners("vectors_of", self.holders(positions), positions)

    def rows_from_owners(
        self, method: str, owners: np.ndarray, *columns: np.ndarray, **options: Any
    ) -> np.ndarray:
        """``(len(owners), ...)`` rows, in their order: shard ``owners[i]``'s ``method`` gives the
        row of ``columns``' ``i``-th values (each shard asked once, for all of its own, all
        shards at once, with ``options`` by keyword)."""
        asked = {s: at for s in range(len(self.handles)) if len(at := np.flatnonzero(owners == s))}
        parts = self._gather(
            {s: getattr(self.handles[s], method).remote(*(c[at] for c in columns), **options)
             for s, at in asked.items()}
        )  # fmt: skip
        if not parts:
            return np.empty((0, 0), dtype=np.float32)
        out = np.empty((len(owners), *parts[0].shape[1:]), dtype=parts[0].dtype)
        for at, part in zip(asked.values(), parts, strict=True):
            out[at] = part
        return out

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's top ``k`` among every shard's candidates (their ordinals), merged."""
        return self._merged("search", queries, k)

    def search_positions(self, positions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` of the texts at ``positions``: each holder's part of the queries goes
        from it to every shard as an object ref (Ray moves it node to node), so their vectors
        never come to the miner; only the merged top lists do."""
        positions = np.asarray(positions, dtype=np.int64)
        owners = self.holders(positions)
        k = min(k, self.rows)
        scores = np.empty((len(positions), k), dtype=np.float32)
        found = np.empty((len(positions), k), dtype=np.int64)
        for owner in np.unique(owners):
            at = np.flatnonzero(owners == owner)
            queries = self._passed_on(self.handles[owner].vectors_of.remote(positions[at]))
            scores[at], found[at] = merge_top_k(self.ask_all("search", queries, k), k)
        return scores, found

    def pair_scores(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(m,)`` float32 cosine of the texts at ``left[i]`` and ``right[i]``: each pair scored
        by the holder of its left text, the right texts' vectors sent there from their holders
        as object refs; only the scores come back."""
        left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
        left_owner, right_owner = self.holders(left), self.holders(right)
        calls = {}
        for pair in {(int(a), int(b)) for a, b in zip(left_owner, right_owner, strict=True)}:
            at = np.flatnonzero((left_owner == pair[0]) & (right_owner == pair[1]))
            vectors = self._passed_on(self.handles[pair[1]].vectors_of.remote(right[at]))
            calls[pair] = (at, self.handles[pair[0]].pair_scores.remote(left[at], vectors))
        scores = np.empty(len(left), dtype=np.float32)
        for (owner, _), (at, answer) in calls.items():
            (scores[at],) = self._gather({owner: answer})
        return scores

    def score_indexed(self, texts: list[str], left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``(len(left),)`` float32: the teacher's score of each pair ``(texts[left[i]],
        texts[right[i]])``, scored where the shards encode, on their GPUs where they have them
        (:meth:`~pipeline.mining.miner_shard.MinerShard.teacher_scores`): the pairs in one
        consecutive part a shard, each part sent with only the texts it reads. The miner's
        pairs come sorted by anchor, so an anchor's pairs mostly meet in one part and a
        bi-encoder teacher reads its text once."""
        left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
        parts = {
            s: at for s, at in enumerate(np.array_split(np.arange(len(left)), len(self.handles))) if len(at)
        }
        calls = {}
        for s, at in parts.items():
            read, local = np.unique(np.concatenate([left[at], right[at]]), return_inverse=True)
            part_texts = [texts[i] for i in read]
            calls[s] = self.handles[s].teacher_scores.remote(part_texts, local[: len(at)], local[len(at) :])
        scores = np.empty(len(left), dtype=np.float32)
        for at, part in zip(parts.values(), self._gather(calls), strict=True):
            scores[at] = part
        return scores

    def computed(self) -> tuple[int, str]:
        """What the shards' teachers have computed so far, in all (:meth:`~pipeline.mining.
        miner_shard.MinerShard.teacher_computed`)."""
        counts, units = zip(*self.ask_all("teacher_computed"), strict=True)
        return sum(counts), units[0]

    def cell_counts(self, centroids: np.ndarray) -> np.ndarray:
        """``(shards, cells)``: each shard assigns its own texts to the unit ``centroids`` on its
        device and keeps the assignment; only each cell's count comes back."""
        return np.stack(self.ask_all("cell_counts", self.to_every_shard(centroids)))

    def order_by_cell(self, offsets: np.ndarray) -> None:
        """Each shard ranks its texts in the partition order from its row of ``offsets``."""
        self._gather({s: h.order_by_cell.remote(offsets[s]) for s, h in enumerate(self.handles)})

    def rows_ranked(self, lo: int, hi: int) -> np.ndarray:
        """The sorted positions ranked ``lo`` to ``hi - 1``: each shard's, in shard order."""
        return np.concatenate(self.ask_all("rows_ranked", lo, hi))

    def keys_of(self, positions: np.ndarray) -> np.ndarray:
        """The text keys of any positions, each from the shard that holds it."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):
            return np.empty(0, dtype=np.int64)
        return self.rows_from_owners("keys_of", self.holders(positions), positions)

    def record_batches(
        self, positions: np.ndarray, batches: np.ndarray, *, version: int, previous: int | None
    ) -> np.ndarray:
        """Each shard keeps its own texts' batches in refresh ``version``'s plan and answers
        their batches in ``previous``'s (-1 from a shard started since)."""
        positions = np.asarray(positions, dtype=np.int64)
        return self.rows_from_owners(
            "record_batches", self.holders(positions), positions, np.asarray(batches, dtype=np.int32),
            version=version, previous=previous,
        )  # fmt: skip

    def exact_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` from every candidate of every shard, whatever their indexes."""
        return self._merged("exact_search", queries, k)

    def set_nprobe(self, nprobe: int) -> None:
        """Probe ``nprobe`` of the shared IVF cells on every shard."""
        self.ask_all("set_nprobe", nprobe)

    def _merged(self, method: str, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.rows)
        parts = self.ask_all(method, self.to_every_shard(np.ascontiguousarray(queries, dtype=np.float32)), k)
        return merge_top_k(parts, k)

    def ask_all(self, method: str, *args: Any) -> list[Any]:
        """Every shard's answer to ``method(*args)``, in shard order, all asked at once (a lost
        shard fails the call as :meth:`_gather` says)."""
        return self._gather({s: getattr(h, method).remote(*args) for s, h in enumerate(self.handles)})

    def _gather(self, calls: dict[int, Any]) -> list[Any]:
        """The answers of calls to shards (shard number: object ref), in order. A shard lost
        since it was asked fails the call with a line that names it; the refresh submitted
        again replaces it (:meth:`encode`).

        Raises:
            ray.exceptions.RayActorError: a shard was lost (the trainer's recovery knows it).
        """
        try:
            return self._fetch(list(calls.values()))
        except actor_lost_errors():
            for number, ref in calls.items():
                try:
                    ray.get(ref)
                except actor_lost_errors() as lost:
                    span = self.spans[number]
                    raise ray.exceptions.RayActorError(
                        error_msg=f"miner shard {number} (rows {span.first}-{span.last - 1}) was lost "
                        f"({first_line(lost)}); the refresh submitted again replaces it"
                    ) from lost
            raise

    def to_every_shard(self, value: Any) -> Any:
        """``value`` as every shard's call takes it: put in the object store once (not once
        per shard), or as it is for the shard in this process."""
        return value if self.in_process else ray.put(value)

    def _passed_on(self, answer: Any) -> Any:
        """A shard's answer as another shard's call takes it: the object ref itself, which Ray
        resolves where that call runs (the data goes shard to shard), or an in-process value."""
        return answer.value if self.in_process else answer

    def _fetch(self, answers: list[Any]) -> list[Any]:
        """The values of shard calls' answers (object refs, or an :class:`InProcessShard`'s)."""
        return [a.value for a in answers] if self.in_process else ray.get(answers)

    def stop(self) -> None:
        """End the shard actors (their vectors and indexes go with them)."""
        if not self.in_process:
            for handle in self.handles:
                ray.kill(handle)


@dataclass(frozen=True)
class Answered:
    """What a call to an :class:`InProcessShard` returned, in place of an object ref."""

    value: Any


class InProcessShard:
    """A :class:`~pipeline.mining.miner_shard.MinerShard` in the miner's process, called as its
    actor handle is (``shard.search.remote(queries, k)``), each call run at once: ``mining.shards:
    1`` runs the code every S runs, without a second process or the object store between them."""

    def __init__(self, shard: MinerShard):
        self.shard = shard

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.shard, method)
        return SimpleNamespace(remote=lambda *args, **kwargs: Answered(call(*args, **kwargs)))


class SampleOverShards:
    """The shared IVF sample as k-means sees it (an :class:`~pipeline.mining.ivf_training.
    AssignableSample`): each shard's part stays in that shard (:meth:`MinerShard.encode_sample`),
    which assigns it to the centroids at every round, all shards at once; their assignments
    are joined in shard order and their cells' sums added up.

    Args:
        shards: the shards, after their ``encode_sample``.
        sizes: each shard's rows of the sample, in shard order.
    """

    def __init__(self, shards: MinerShards, sizes: list[int]):
        self.shards = shards
        self.starts = np.cumsum([0, *sizes])

    def count(self) -> int:
        return int(self.starts[-1])

    def dim(self) -> int:
        return self.shards.dim

    def get_subset(self, indices: np.ndarray) -> np.ndarray:
        picks = np.asarray(indices, dtype=np.int64)
        owners = np.searchsorted(self.starts, picks, side="right") - 1
        return self.shards.rows_from_owners("sample_vectors", owners, picks - self.starts[owners])

    def assign_to(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        answers = self.shards.ask_all(
            "sample_assign", self.shards.to_every_shard(np.ascontiguousarray(centroids, np.float32))
        )
        nearest, similarity, sums = zip(*answers, strict=True)
        return np.concatenate(nearest), np.concatenate(similarity), sum(sums)


def shared_sample(firsts: Sequence[int], rows: int, *, seed: int) -> list[np.ndarray]:
    """The sample an index over ``rows`` vectors in all trains its cells on
    (:func:`~pipeline.mining.index.training_rows`), split over the shards that start at
    ``firsts`` (ascending, the first 0): each shard's part as positions within the shard."""
    sample = training_rows(rows, "ivf", seed)
    bounds = [*firsts, rows]
    at = np.searchsorted(sample, bounds)
    return [sample[at[s] : at[s + 1]] - bounds[s] for s in range(len(firsts))]


def shard_actor_options(settings: MinerSettings) -> dict[str, Any]:
    """A shard actor's Ray options: what the miner reserves (``mining.num_cpus``,
    ``mining.num_gpus``, a node ``mining.label_selector`` matches). No restarts by Ray: a shard
    lost mid-refresh fails that refresh, and the refresh submitted again replaces it
    (:meth:`MinerShards.encode`)."""
    return {
        "num_cpus": settings.num_cpus,
        "num_gpus": settings.num_gpus,
        "label_selector": settings.label_selector or None,
        "max_restarts": 0,
        "runtime_env": actor_runtime_env() or None,
    }
