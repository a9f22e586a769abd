"""Where an epoch's plan comes from, and how a rank gets its share of it without the whole.

A plan travels as :class:`PlanSource`: a seed, or the storage URI of what the miner returned,
plus the seeds its batches were reordered with. That is small, holds no object refs, and is
the same on every rank, so it is what rank 0 broadcasts and what a checkpoint keeps. Each rank
then gets its share (:func:`share_of`) from one Ray task a boundary: the task makes the whole
plan once, cuts every rank's slice of every batch out of it with the rows' negatives beside them
(:meth:`~pipeline.batching.plan.BatchPlan.shares`), and returns each share as an object of its
own; a rank fetches only its own. The whole plan and the whole negatives column never sit in a
train worker.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.batching.false_negative_graph import FalseNegativeGraph
from pipeline.batching.negative_draw import draw_negatives
from pipeline.batching.plan import BatchPlan, PlanShare
from pipeline.batching.same_text import rows_sharing_a_text
from pipeline.batching.samplers import random_plan
from pipeline.config.schema import Config
from pipeline.config.train_section import LENGTH_GROUP_BATCHES
from pipeline.data.formats import filesystem_of
from pipeline.data.plan_file import read_plan_file
from pipeline.data.tokenized import padded_lengths, row_lengths
from pipeline.data.triplets import Triplets


@dataclass(frozen=True)
class PlanSource:
    """How to make an epoch's whole plan again, on any process of any node.

    A random plan is its ``seed``; a mined corpus plan is the URI the miner's plan was written
    to (``mined_plan``) and the seeds its batches were put in a new order with since
    (``reorders``, oldest first). The pairs task's rows always go in random batches, and its
    mined negatives column is a URI too (``negatives``).
    """

    version: int
    seed: int | None = None
    """The random plan's seed (None where the plan was mined)."""
    mined_plan: str | None = None
    """URI of the mined corpus plan (:mod:`~pipeline.data.plan_file`); None: a random plan."""
    reorders: tuple[int, ...] = ()
    """Seeds of :meth:`~pipeline.batching.plan.BatchPlan.reordered`, applied in turn to the mined plan."""
    negatives: str | None = None
    """URI of the pairs task's mined negatives column; None: none mined yet (or the corpus task)."""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reorders": list(self.reorders)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> PlanSource:
        return cls(**{**saved, "reorders": tuple(saved.get("reorders", ()))})


@dataclass(frozen=True)
class PlanInputs:
    """What any plan is made from, as the driver put it in the object store."""

    config: Config
    lengths_ref: Any
    """Object ref of the tokens per corpus position (``TokenizedBlocks.lengths_ref``)."""
    triplets_ref: Any = None
    """Object ref of the pairs task's :class:`~pipeline.data.triplets.Triplets`; None for a corpus."""


def random_batches(
    cfg: Config,
    seed: int,
    lengths: np.ndarray,
    same_text_rows: FalseNegativeGraph | None = None,
    *,
    given_negatives: bool = False,
) -> BatchPlan:
    """A version-0 plan of random batches over the ``len(lengths)`` training rows, rows that
    share a text (``same_text_rows``, pairs) in different batches, as sentence-transformers'
    ``NO_DUPLICATES`` batches keep them; length-grouped where
    :meth:`~pipeline.config.schema.Config.groups_by_length` says so for these rows
    (``given_negatives``: whether any row carries a given negative)."""
    grouped = cfg.groups_by_length(given_negatives=given_negatives)
    return random_plan(
        len(lengths),
        cfg.train.batch_size,
        seed=seed,
        version=0,
        lengths=lengths,
        group_batches=LENGTH_GROUP_BATCHES if grouped else 0,
        false_negatives=same_text_rows,
    )


def whole_plan(
    source: PlanSource, cfg: Config, text_lengths: np.ndarray | None, triplets: Triplets | None
) -> tuple[BatchPlan, MinedColumn]:
    """The plan ``source`` names and the negatives column its epoch trains on, with the
    teacher's scores beside it (:func:`epoch_negatives`), with every row
    (``text_lengths``: tokens per corpus position, which a random plan's length grouping and
    size read; a mined plan needs neither it nor the ``triplets``)."""
    if source.mined_plan is None:
        assert source.seed is not None and text_lengths is not None
        same_text = rows_sharing_a_text(triplets.row_texts()) if triplets is not None else None
        given = triplets is not None and triplets.has_given_negatives
        plan = random_batches(
            cfg, source.seed, row_lengths(text_lengths, triplets), same_text, given_negatives=given
        )
    else:
        plan = read_plan_file(source.mined_plan, source.version)
        for seed in source.reorders:
            plan = plan.reordered(seed)
    return dataclasses.replace(plan, version=source.version), epoch_negatives(source, cfg)


@dataclass(frozen=True)
class MinedColumn:
    """The pairs task's mined negatives column and the teacher's scores beside it (each None
    where there is none)."""

    negatives: np.ndarray | None = None
    """``(rows, m)`` text positions, -1 where none."""
    teacher_scores: np.ndarray | None = None
    """``(rows, 1 + m)`` float32: the teacher's score of each row's positive, then of each
    negative (NaN where none)."""


def epoch_negatives(source: PlanSource, cfg: Config) -> MinedColumn:
    """The negatives column the epoch ``source`` names trains on: the mined column, or, where a
    refresh keeps more per anchor than an epoch uses (``mining.sampling: random``:
    :attr:`~pipeline.config.schema.Config.negatives_mined`), each row's
    ``mining.num_negatives`` drawn among them with the epoch's seed
    (:func:`~pipeline.batching.negative_draw.draw_negatives`), the teacher's scores drawn with
    them."""
    column = read_negatives(source)
    if column.negatives is None or cfg.negatives_mined == cfg.mining.num_negatives:
        return column
    assert source.seed is not None  # a pairs plan is random: every epoch has its seed
    negatives, scores = draw_negatives(
        column.negatives, mined=cfg.negatives_mined, keep=cfg.mining.num_negatives, seed=source.seed,
        teacher_scores=column.teacher_scores,
    )  # fmt: skip
    return MinedColumn(negatives, scores)


def read_negatives(source: PlanSource) -> MinedColumn:
    """The pairs task's whole mined-negatives column ``source`` names, and the teacher's scores
    beside it (both None: none mined)."""
    return MinedColumn() if source.negatives is None else read_mined(source.negatives)


def read_mined(uri: str) -> MinedColumn:
    """What :func:`write_mined` wrote to ``uri``: the negatives column and the teacher's scores
    beside it (None where there were none)."""
    saved = np.load(io.BytesIO(read_bytes(uri)))
    if isinstance(saved, np.ndarray):  # a run checkpointed before the column became an .npz
        return MinedColumn(saved)
    scores = saved["teacher_scores"] if "teacher_scores" in saved.files else None
    return MinedColumn(saved["negatives"], scores)


def make_shares(
    source: PlanSource, cfg: Config, text_lengths: np.ndarray, triplets: Triplets | None, *, world: int
) -> list[PlanShare]:
    """Every rank's share of the plan ``source`` names, from one making of the whole plan, each
    with the texts its rows encode."""
    plan, column = whole_plan(source, cfg, text_lengths, triplets)
    shares = plan.shares(
        world=world, negatives=column.negatives, teacher_scores=column.teacher_scores,
        lengths=padded_lengths(text_lengths, triplets),
    )  # fmt: skip
    return [_with_texts(share, text_lengths, triplets) for share in shares]


def _with_texts(share: PlanShare, text_lengths: np.ndarray, triplets: Triplets | None) -> PlanShare:
    texts = share.rows
    if triplets is not None:
        parts = [triplets.anchor[share.rows], triplets.positive[share.rows], triplets.negative[share.rows]]
        if share.negatives is not None:
            parts.append(share.negatives.reshape(-1))
        texts = np.concatenate(parts)
        texts = texts[texts >= 0]
    texts = np.unique(texts)
    return dataclasses.replace(share, texts=texts, text_lengths=np.asarray(text_lengths)[texts])


def share_of(source: PlanSource, inputs: PlanInputs, *, world: int, rank: int) -> PlanShare:
    """Rank ``rank`` of ``world``'s share of the plan ``source`` names: its slice of every
    batch, the rows' negatives and the texts it will encode. Every rank calls it at once.

    Rank 0 starts one Ray task (:func:`make_shares`, ``num_returns=world``): it holds the
    whole plan for a moment, in its own process, and returns each rank's share as an object
    of its own. Their refs reach the other ranks through Ray Train's broadcast, whose Ray
    serialization tracks the ranks that borrow them (``torch.distributed``'s pickle would not),
    and each rank fetches only its own. The task reserves no CPU: the ranks that ask are
    waiting for it with theirs."""
    import ray

    refs = None
    if rank == 0:
        task = ray.remote(num_cpus=0, num_returns=world)(_returned_apart)
        made = task.remote(source, inputs.config, inputs.lengths_ref, inputs.triplets_ref, world=world)
        refs = [made] if world == 1 else made
    if world > 1:
        from ray.train.collective import broadcast_from_rank_zero  # a train worker's collective

        refs = broadcast_from_rank_zero(refs)
    return ray.get(refs[rank])


def _returned_apart(*args: Any, world: int) -> PlanShare | tuple[PlanShare, ...]:
    """:func:`make_shares` as a task of ``num_returns=world`` returns them (one: the share)."""
    shares = make_shares(*args, world=world)
    return shares[0] if world == 1 else tuple(shares)


def read_bytes(uri: str) -> bytes:
    filesystem, path = filesystem_of(uri)
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


def write_mined(
    folder: str,
    name: str,
    *,
    negatives: np.ndarray,
    teacher_scores: np.ndarray | None = None,
) -> str:
    """Write what a pairs refresh mined (its ``negatives`` column and the teacher's scores
    beside it, if any) to ``folder/name`` (an ``.npz`` in a local folder or at a URI every node
    reads: the run's storage); returns its URI. (A corpus plan is written as it is planned:
    :mod:`~pipeline.data.plan_file`.)"""
    buffer = io.BytesIO()
    arrays = {"negatives": np.asarray(negatives)}  # int32 or int64, as mined
    if teacher_scores is not None:
        arrays["teacher_scores"] = np.asarray(teacher_scores, dtype=np.float32)
    np.savez(buffer, **arrays)
    uri = f"{folder.rstrip('/')}/{name}"
    filesystem, path = filesystem_of(uri)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as stream:
        stream.write(buffer.getvalue())
    return uri
