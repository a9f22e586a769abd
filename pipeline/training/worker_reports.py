"""What a training worker reports while it trains: evaluations (:class:`EvalRecorder`) and
checkpoints (:class:`CheckpointReporter`), both collectives that every rank calls, and rank
0's console lines (:class:`ProgressLine`)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import torch
import torch.distributed as dist

from pipeline.batching.plan import PlanShare
from pipeline.evaluation.in_training import EvalOutcome, TrainingEvaluator, eval_metric_names
from pipeline.model.encoder import SentenceEncoder
from pipeline.model.folders import save_model_dir
from pipeline.training.checkpoint import save_checkpoint
from pipeline.training.contract import report_metrics
from pipeline.training.state import BestModel, TrainState, capture_rng


class EvalRecorder:
    """Scores the live model on the STS and retrieval sets and records the result: an entry in the history,
    a copy of the best model so far in ``best_dir``, rank 0's metrics and an ``[eval]`` line.

    The starting model is scored (the "before") but never kept as the best: the job ships a
    trained model.
    """

    def __init__(
        self,
        evaluator: TrainingEvaluator,
        model: SentenceEncoder,
        tokenizer: Any,
        *,
        best_dir: Path,
        max_seq_len: int,
        logger: Any,
    ):
        self.evaluator = evaluator
        self.model, self.tokenizer = model, tokenizer
        self.best_dir, self.max_seq_len = best_dir, max_seq_len
        self.logger = logger

    def evaluate(self, state: TrainState, epoch: float) -> EvalOutcome | None:
        """Evaluate at ``epoch`` (fractional inside an epoch, 0 for the starting model) and
        ``state.step``; None where the evaluator scored nothing. Restores train mode."""
        started = time.perf_counter()
        outcome = self.evaluator.evaluate(self.model)
        if outcome is None:
            return None
        metrics = outcome.metrics()
        state.history.evaluations.append({"epoch": float(epoch), "step": float(state.step), **metrics})
        if epoch > 0 and (state.history.best is None or outcome.selection_score > state.history.best.score):
            state.history.best = BestModel(outcome.selection_score, float(epoch), state.step)
            shutil.rmtree(self.best_dir, ignore_errors=True)
            save_model_dir(self.model, self.tokenizer, self.best_dir, self.max_seq_len)
        if self.logger is not None:
            self.logger.log(
                {**eval_metric_names(metrics), "eval/wall_seconds": time.perf_counter() - started}, state.step
            )
            self.logger.flush()
        print(
            f"[eval] epoch {epoch:g} step {state.step}: {outcome.describe()} "
            f"({time.perf_counter() - started:.1f}s)",
            flush=True,
        )
        return outcome


class CheckpointReporter:
    """Reports a checkpoint to Ray Train from every rank (``ray.train.report`` is a barrier);
    rank 0 writes it: weights, tokenizer, optimizer, schedule, :class:`TrainState` and the
    best model's folder."""

    def __init__(
        self,
        model: SentenceEncoder,
        tokenizer: Any,
        *,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        best_dir: Path,
        max_seq_len: int,
        rank: int,
        world: int,
        logger: Any,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.best_dir, self.max_seq_len = best_dir, max_seq_len
        self.rank, self.world = rank, world
        self.logger = logger

    def report(self, state: TrainState, epoch: float, augment_rng: np.random.Generator | None) -> None:
        """Checkpoint ``state`` at ``epoch`` (fractional inside an epoch).

        Mid-epoch (``augment_rng`` given) every rank's random state goes in, so a resumed
        run draws the same dropout masks and repetitions as the lost one."""
        state.rng = self._gather_rng(augment_rng) if augment_rng is not None else None
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if self.rank == 0:
                if self.logger is not None:
                    # Send what is buffered now; what the server does not take in time travels
                    # in the checkpoint and is sent again by whoever resumes from it.
                    self.logger.wait_sent(timeout=2.0)
                    state.unsent_metrics = self.logger.unsent()
                save_checkpoint(
                    Path(tmp), self.model, self.tokenizer, optimizer=self.optimizer, scheduler=self.scheduler, state=state,
                    max_seq_len=self.max_seq_len, best_dir=self.best_dir,
                )  # fmt: skip
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(report_metrics(state, epoch), checkpoint=ckpt)
        state.rng = None

    def _gather_rng(self, augment_rng: np.random.Generator) -> list[dict[str, Any]]:
        """Every rank's random state, rank order."""
        mine = capture_rng(augment_rng)
        if self.world == 1:
            return [mine]
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, mine)
        return gathered


PROGRESS_EVERY_S = 30.0


class ProgressLine:
    """Rank 0's ``[train]`` lines: the epoch's running loss every :data:`PROGRESS_EVERY_S`
    seconds, and the epoch's summary at its end."""

    def __init__(self, epochs: int, batch_size: int, pairs: bool = False):
        self.epochs, self.batch_size = epochs, batch_size
        self.pairs = pairs
        """The pairs task: a refresh changes the rows' negatives, not the batches."""
        self.last = 0.0

    def restart(self, now: float) -> None:
        self.last = now

    def maybe_print(
        self, epoch: int, state: TrainState, segment_first_batch: int, segment_start: float
    ) -> None:
        if time.perf_counter() - self.last <= PROGRESS_EVERY_S:
            return
        assert state.plan is not None
        self.last = time.perf_counter()
        done = state.batches_done - segment_first_batch  # the rate of the segment's steps
        rate = done * self.batch_size / (self.last - segment_start + 1e-9)
        # A pairs row is an anchor, its positive and its negatives: counting them as sentences
        # would read as a rate 2 + k times lower than the texts encoded.
        unit = "rows" if self.pairs else "sentences"
        print(
            f"[train] epoch {epoch + 1}/{self.epochs} step {state.batches_done}/{state.plan.num_batches}: "
            f"loss {state.loss_sum / state.batches_done:.4f}, {rate:.0f} {unit}/s",
            flush=True,
        )

    def epoch_line(
        self,
        epoch: int,
        loss: float,
        *,
        plan: PlanShare,
        seconds: float,
        next_plan: PlanShare | None,
        boundary: Any,
    ) -> str:
        """Rank 0's line at the end of epoch ``epoch`` (0-based); ``next_plan`` None where no
        epoch follows because the run stopped early."""
        ended = (
            f"[train] epoch {epoch + 1}/{self.epochs}: loss {loss:.4f} over {plan.num_batches} steps on plan "
            f"v{plan.version}, {seconds:.1f}s"
        )
        if next_plan is None:
            return f"{ended}; no next epoch"
        late = "; the refresh under way was not ready: plan kept, reshuffled" if boundary.late else ""
        return (
            f"{ended}; next plan v{next_plan.version} (waited {boundary.wait_seconds:.1f}s, "
            f"staleness {boundary.staleness_steps} steps{late}){churn_note(boundary.churn, self.pairs)}"
        )

    def early_stop_line(self, epoch: int, history: Any, patience: int) -> str:
        """Rank 0's line when ``eval.patience`` ends the run after epoch ``epoch`` (0-based)."""
        best = history.best
        since = f"epoch {best.epoch:g} (step {best.step}, score {best.score:.2f})" if best else "the start"
        return (
            f"[train] early stop after epoch {epoch + 1}/{self.epochs}: the last {patience} "
            f"evaluation{'s' if patience != 1 else ''} did not beat {since} (eval.patience={patience})"
        )


BARELY_MOVED = 0.05
"""A refresh that changes less than this share of the negatives trains on nearly what the last
mining gave: the epoch line says so. On Twitter URL each refresh changed 49-65% of the rows'
negatives and still scored level with mining once (docs/results.md), so a large share is no
proof that refreshing pays; a small one shows that it cannot."""


def churn_note(churn: float | None, pairs: bool) -> str:
    """The epoch line's note on what the adopted refresh changed (``mining/churn``); empty when
    there was no earlier mining to compare with."""
    if churn is None:
        return ""
    what = "the rows' mined negatives" if pairs else "the plan's batches"
    note = f"; the refresh changed {churn:.0%} of {what}"
    if churn < BARELY_MOVED:
        note += " (the model barely moved since the last mining: mining.refresh=once would train on nearly the same)"
    return note


def log_epoch_start(logger: Any, epoch: int, plan: PlanShare) -> None:
    """Rank 0, as epoch ``epoch`` (0-based) starts: the fingerprint of its whole plan and the
    rows' negatives column, and its sampler, as tags (a hash or a name is no quantity to chart)."""
    logger.set_tags({f"plan.fingerprint.epoch_{epoch + 1}": plan.fingerprint,
                     f"plan.sampler.epoch_{epoch + 1}": plan.sampler})  # fmt: skip


def log_epoch_end(
    logger: Any, epoch: int, loss: float, *, plan: PlanShare, seconds: float, step: int, padding: float
) -> None:
    """Rank 0, at the last step of epoch ``epoch`` (0-based): its mean loss, the plan version it
    trained on, its training time, the share of padding its batches carried and the epochs
    done: every per-epoch value at the same step, so their charts line up."""
    logger.log({"train/epoch_loss": loss, "train/plan_version": float(plan.version), "train/epoch_seconds": seconds,
                "train/padding_share": padding, "train/epoch": float(epoch + 1)}, step)  # fmt: skip


def step_metrics(
    loss: float,
    learning_rate: float,
    *,
    rows: int,
    tokens: int,
    flops: float,
    seconds: float,
    peak_tflops: float | None,
) -> dict[str, float]:
    """A step's ``train/`` metrics: ``tokens`` is this rank's share, the tokens its encoder ran
    (both views, or the triplet's texts); ``train/mfu`` only where the device's peak is known."""
    metrics = {
        "train/loss": loss,
        "train/learning_rate": learning_rate,
        "train/sentences_per_s": rows / seconds,
        "train/tokens_per_s": tokens / seconds,
    }
    if peak_tflops:
        metrics["train/mfu"] = flops / seconds / (peak_tflops * 1e12)
    return metrics
