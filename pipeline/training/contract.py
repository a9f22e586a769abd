"""What the driver hands every training worker, and what the workers report back.

The driver builds one :class:`LoopConfig` and puts it in the object store; Ray Train's
``train_loop_config`` carries only its reference (see
:func:`pipeline.training.trainer.build_trainer`). Large inputs inside it travel as object-store
references too, so that each node fetches them once. Every
``ray.train.report`` carries :func:`report_metrics`, from which the driver reads the run's
:class:`~pipeline.training.state.TrainHistory` with :func:`history_from_report`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config.schema import Config
from pipeline.data.text_blocks import DistinctTexts
from pipeline.data.tokenized import TokenizedBlocks
from pipeline.training.state import TrainHistory, TrainState


@dataclass(frozen=True)
class LoopConfig:
    """The training workers' inputs, resolved once by the driver."""

    config: Config
    """The resolved run config (the one written to ``resolved_config.yaml``)."""
    model_ref: Any
    """Object ref of the packed initial model folder (:func:`pipeline.model.folders.pack_dir`)."""
    corpus: TokenizedBlocks
    """The tokenized corpus' blocks in the object store; each worker assembles them."""
    triplets_ref: Any = None
    """Object ref of the :class:`~pipeline.data.triplets.Triplets` in the pairs task, else None."""
    eval_ref: Any = None
    """Object ref of the :class:`~pipeline.evaluation.scoring.STSEvalSet`, or None (no STS eval)."""
    retrieval_ref: Any = None
    """Object ref of the :class:`~pipeline.evaluation.retrieval_scoring.RetrievalEvalSet`, or
    None (no retrieval eval)."""
    texts: DistinctTexts | None = None
    """The distinct texts' blocks, which the miner's teacher reads (``mining.teacher.model``);
    None without a teacher."""
    teacher_ref: Any = None
    """Object ref of the packed teacher folder (a local ``mining.teacher.model``), or None."""
    miner: Any = None
    """The miner actor's handle, or None when no refresh runs."""
    miner_pid: int | None = None
    """The miner's process id when the driver saw it ready (a new one means Ray restarted it)."""
    tracking_uri: str | None = None
    run_id: str | None = None
    """The MLflow run rank 0 logs to; None logs nothing."""
    tracking_relay: str | None = None
    """The name of the driver's :class:`~pipeline.tracking.relay.TrackingRelay` when the store
    is on its disk (rank 0 logs through it); None: rank 0 opens ``tracking_uri`` itself."""
    driver_node_id: str | None = None
    """The Ray node the driver runs on: it samples that machine's system metrics for the whole
    job, so workers sample only the other nodes."""


def miner_inputs(
    corpus: TokenizedBlocks,
    model_ref: Any,
    triplets_ref: Any = None,
    texts: DistinctTexts | None = None,
    teacher_ref: Any = None,
) -> list[Any]:
    """What every call to the miner actor (:class:`pipeline.mining.miner_actor.HardNegativeMinerActor`)
    brings: the tokenized corpus' blocks, the object refs of the packed model folder and the
    triplets (None in the corpus task), the distinct texts a teacher reads and the object ref
    of its packed folder (None without a teacher, or for a hub name the miner fetches), in
    that order. A list, so that Ray hands them over unresolved."""
    return [corpus, model_ref, triplets_ref, texts, teacher_ref]


def report_metrics(state: TrainState, epoch: float) -> dict[str, Any]:
    """What a checkpoint reports to Ray Train: position (``epoch`` is fractional inside an
    epoch), the current plan's version, whether its refresh is still pending, and the whole
    :class:`TrainHistory`."""
    assert state.plan is not None
    return {
        "epoch": epoch,
        "step": state.step,
        "plan_version": state.plan.version,
        # An epoch-end checkpoint written before its refresh came back: resuming asks again.
        "plan_pending": state.plan_pending,
        "history": state.history.to_dict(),
    }


def history_from_report(metrics: dict[str, Any]) -> TrainHistory:
    """The :class:`TrainHistory` in the last report (empty when nothing was reported)."""
    return TrainHistory.from_dict(metrics["history"]) if "history" in metrics else TrainHistory()
