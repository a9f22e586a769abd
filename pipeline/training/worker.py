"""The per-worker SimCSE train loop that Ray Train's ``TorchTrainer`` runs on every worker.

One ``fit()`` runs every epoch (each ``fit`` costs ~20 s of start-up). At each epoch end
rank 0 hands the newest encoder weights to the miner actor, broadcasts the returned plan to
the other ranks, and every rank reports a checkpoint (see :mod:`pipeline.training.checkpoint`);
``checkpoint.every_steps`` adds checkpoints inside an epoch. Ray Train restarts a failed
worker group from the latest checkpoint (``train.max_failures``), and a job started again
with the same run name resumes from it: at the same step, on the same plan, with every
rank's random state restored, so the redone steps repeat the lost ones exactly.

:func:`train_loop_per_worker` reads as the algorithm; :class:`SimCSEWorker` holds what it
works on. Setup pieces are in :mod:`pipeline.training.worker_setup`, the step's forward pass
and loss in :mod:`pipeline.training.step`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
import torch.distributed as dist

from pipeline.core.scratch import process_scratch
from pipeline.core.seams import hold_once
from pipeline.model.flops import CountingEncoder, EncoderFlops
from pipeline.tracking.metric_logger import DRAIN_TIMEOUT_S
from pipeline.training.contract import LoopConfig
from pipeline.training.epoch_rng import seed_epoch
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.plan_broadcast import from_rank0
from pipeline.training.refresh import Boundary, adopt_plan
from pipeline.training.step import OptimizerStep
from pipeline.training.worker_reports import (
    ProgressLine,
    log_epoch_end,
    log_epoch_start,
    step_metrics,
)
from pipeline.training.worker_setup import WorkerParts, system_metrics_monitor, worker_parts

LOOP_CONFIG_KEY = "loop_config"
"""The key of ``train_loop_config`` that holds the object ref of the :class:`LoopConfig`."""


def train_loop_per_worker(train_loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: runs on every worker, on the :class:`LoopConfig` whose object ref
    ``train_loop_config`` holds. The first worker on each node also logs the node's system
    metrics (``tracking.system_metrics``) while it trains. The worker's local files live in a
    temp folder of its own, removed when it ends or fails (a killed process's, by the next
    worker on its node: :func:`~pipeline.core.scratch.process_scratch`)."""
    loop_config: LoopConfig = ray.get(train_loop_config[LOOP_CONFIG_KEY])
    ctx = ray.train.get_context()
    with (
        system_metrics_monitor(loop_config, ctx),
        process_scratch("simcse-worker-") as scratch,
    ):
        worker = SimCSEWorker.setup(loop_config, ctx, scratch=scratch)
        worker.start()
        while worker.trains_another_epoch():
            epoch = worker.state.epoch
            worker.run_epoch(epoch)
            worker.end_epoch(epoch)
        worker.close()


class SimCSEWorker:
    """One DDP rank's training: the model, optimizer, schedule and :class:`TrainState`, the
    plan refresher, the evaluator and (rank 0) the metric logger.

    :meth:`setup` builds it (resuming from the latest checkpoint if there is one),
    :meth:`start` catches up on what a checkpoint left open, then per epoch
    :meth:`run_epoch` trains its batches and :meth:`end_epoch` evaluates, checkpoints and
    adopts the next plan; :meth:`close` ends it.
    """

    def __init__(self, parts: WorkerParts):
        cfg = parts.cfg
        self.cfg, self.rank, self.world = cfg, parts.rank, parts.world
        self.model, self.train_step = parts.model, parts.train_step
        self.optimizer, self.scheduler = parts.optimizer, parts.scheduler
        self.optimizer_step = OptimizerStep(
            parts.model, parts.optimizer, parts.scheduler, cfg.train.max_grad_norm
        )
        self.state = parts.state
        self.share, self.device = parts.share, parts.device
        self.refresher, self.evaluator, self.checkpoints = parts.refresher, parts.evaluator, parts.checkpoints
        self.logger = parts.logger
        """Rank 0's metric logger; None on the other ranks and in runs without tracking."""
        self.counted_model = CountingEncoder(parts.ddp_model, EncoderFlops.of(parts.model))
        """What the train step calls: the DDP model, counting the tokens and FLOPs it encodes."""
        self.peak_tflops = parts.peak_tflops
        """The device's peak for ``train/mfu`` (None: no MFU logged)."""
        self.progress = ProgressLine(cfg.train.epochs, cfg.train.batch_size, pairs=cfg.pairs)
        # The epoch in progress: its augmentation generator (set by run_epoch), the start of
        # its current timed segment (restarted by each mid-epoch checkpoint, so checkpoint
        # time stays out of the epoch's time) and the batch that segment started at, and its
        # first batch in this run.
        self.augment_rng = np.random.default_rng()
        self.segment_start = 0.0
        self.segment_first_batch = 0
        self.first_batch = 0

    @classmethod
    def setup(cls, loop_config: LoopConfig, ctx: Any, *, scratch: Path) -> SimCSEWorker:
        """Everything for this rank to train, from the driver's inputs and the Ray Train
        context; from the latest complete checkpoint when the run resumes. Its local files go
        in ``scratch``."""
        return cls(worker_parts(loop_config, ctx, scratch=scratch))

    def start(self) -> None:
        """Before the first epoch: send the metrics the checkpoint carried unsent, redo the
        refresh an epoch-end checkpoint was written before, and score a fresh run's
        starting model (the "before" of every comparison)."""
        state = self.state
        if self.logger is not None and state.unsent_metrics:
            self.logger.requeue(state.unsent_metrics)
        state.unsent_metrics = []
        if state.plan_pending:
            # Resumed from an epoch-end checkpoint written before its refresh came back: the
            # refresh is asked again, from the same weights.
            boundary = self.adopt_next_plan(state.epoch - 1)
            assert state.plan is not None
            if self.rank == 0:
                print(
                    f"[train] epoch {state.epoch} was checkpointed before its refresh; next plan "
                    f"v{state.plan.version} (waited {boundary.wait_seconds:.1f}s)",
                    flush=True,
                )
        if self.refresher.mines_before_training(state.step):
            # Waited for in every mode; an async run still charts its (zero) staleness from here.
            boundary = adopt_plan(
                state,
                self.refresher.initial_plan(state, self.model),
                self.logger,
                refresh_waits=self.refresher.waits,
            )
            if self.rank == 0:
                print(
                    f"[train] negatives mined with the starting weights: plan v{state.plan.version} "
                    f"(waited {boundary.wait_seconds:.1f}s)",
                    flush=True,
                )
        if self.evaluator is not None and state.step == 0:
            self.evaluate(0)

    def trains_another_epoch(self) -> bool:
        """Whether an epoch is left: ``train.epochs`` not reached and ``eval.patience`` has not
        ended the run (a run resumed after it stopped early stays stopped)."""
        return self.state.epoch < self.cfg.train.epochs and not self.state.history.stopped_early

    def run_epoch(self, epoch: int) -> None:
        """Train epoch ``epoch`` (0-based) on the current plan, from the batch the state is at,
        with the mid-epoch evaluations and checkpoints the config asks for. First the rank
        takes the rows its share of the plan names (and, for pairs, their texts) out of the
        object store: no rank holds the whole corpus."""
        state = self.state
        plan = state.plan
        assert plan is not None
        self.first_batch = state.batches_done
        assert plan.texts is not None and plan.text_lengths is not None
        self.share.hold(plan.texts, plan.text_lengths)
        self.augment_rng = seed_epoch(
            self.cfg.run.seed,
            rank=self.rank,
            world=self.world,
            epoch=epoch,
            first_batch=self.first_batch,
            saved=state.rng,
        )
        state.rng = None
        if self.logger is not None:
            log_epoch_start(self.logger, epoch, plan)
        self.model.train()
        self.start_segment(self.first_batch)
        self.refresher.after_step(epoch, self.first_batch, plan, self.state.step, self.model)
        for batch_index in range(self.first_batch, plan.num_batches):
            if self.rank == 0:
                hold_once("train_step", self.state.step + 1)
            self.train_batch(batch_index)
            self.refresher.after_step(epoch, batch_index + 1, plan, self.state.step, self.model)
            self.maybe_eval(epoch)
            self.maybe_checkpoint(epoch)
            if self.rank == 0:
                self.progress.maybe_print(epoch, self.state, self.segment_first_batch, self.segment_start)

    def train_batch(self, batch_index: int) -> None:
        """One optimizer step on the plan's batch ``batch_index``; logs its loss, learning rate
        and throughput (rank 0)."""
        state, cfg = self.state, self.cfg
        assert state.plan is not None
        step_start = time.perf_counter()
        batch = GlobalBatch.of_share(state.plan, batch_index, self.device)
        loss, loss_to_backward = self.train_step(self.counted_model, batch, self.augment_rng)
        self.optimizer_step(loss_to_backward)
        state.step += 1
        state.batches_done = batch_index + 1
        loss_value = float(loss.detach())  # waits for the step's device work
        elapsed = max(time.perf_counter() - step_start, 1e-9)
        tokens, flops = self.counted_model.take()
        state.loss_sum += loss_value
        if self.logger is not None:
            lr = self.scheduler.get_last_lr()[0]
            self.logger.log(step_metrics(loss_value, lr, rows=len(batch.rows), tokens=tokens, flops=flops, seconds=elapsed, peak_tflops=self.peak_tflops),
                            state.step)  # fmt: skip
            if state.step % cfg.train.log_every == 0:
                self.logger.flush()

    def _inside_epoch(self) -> bool:
        assert self.state.plan is not None
        return self.state.batches_done < self.state.plan.num_batches

    def maybe_eval(self, epoch: int) -> None:
        """Evaluate inside the epoch every ``eval.every_steps`` steps (the epoch's end has its own)."""
        every, state = self.cfg.eval.every_steps, self.state
        if self.evaluator is None or not every or state.step % every or not self._inside_epoch():
            return
        assert state.plan is not None
        # The evaluator puts the model back in train mode itself.
        self.evaluate(epoch + state.batches_done / state.plan.num_batches)

    def maybe_checkpoint(self, epoch: int) -> None:
        """Checkpoint inside the epoch every ``checkpoint.every_steps`` steps, with every rank's
        random state (the epoch's end has its own checkpoint)."""
        every, state = self.cfg.checkpoint.every_steps, self.state
        if not every or state.step % every or not self._inside_epoch():
            return
        assert state.plan is not None
        state.epoch_seconds += time.perf_counter() - self.segment_start
        self.checkpoint(epoch + state.batches_done / state.plan.num_batches, self.augment_rng)
        # A checkpoint is not training time (BERT-base's took 30 s on a GPU machine): the
        # epoch's seconds and the progress line's rate go on from its end.
        self.start_segment(state.batches_done)

    def start_segment(self, first_batch: int) -> None:
        """Start a timed segment of the epoch at ``first_batch``: at the epoch's start (or its
        resume) and after each mid-epoch checkpoint."""
        self.segment_start, self.segment_first_batch = time.perf_counter(), first_batch
        self.progress.restart(self.segment_start)

    def end_epoch(self, epoch: int) -> None:
        """Close epoch ``epoch``: record and log its loss and time, evaluate, checkpoint, and
        adopt the next epoch's plan.

        When the boundary asks the miner, the finished epoch is checkpointed before the wait
        for the plan: a miner that fails or hangs then costs a refresh (redone on resume),
        never the epoch."""
        state, plan = self.state, self.state.plan
        assert plan is not None
        epoch_loss = state.loss_sum / plan.num_batches
        state.history.epoch_losses.append(epoch_loss)
        state.history.plan_versions.append(plan.version)
        epoch_seconds = state.epoch_seconds + time.perf_counter() - self.segment_start
        if self.evaluator is not None:
            self.evaluate(epoch + 1)
        state.history.stopped_early = self.stops_early()
        state.epoch = epoch + 1
        state.batches_done, state.loss_sum, state.epoch_seconds = 0, 0.0, 0.0
        if self.logger is not None:
            log_epoch_end(
                self.logger,
                epoch,
                epoch_loss,
                plan=plan,
                seconds=epoch_seconds,
                step=state.step,
                padding=plan.padding,
            )
        asks_miner = self.refresher.asks_miner(epoch) and not state.history.stopped_early
        if asks_miner:
            state.plan_pending = True
            self.checkpoint(float(state.epoch), None)
        if state.history.stopped_early:
            # No next epoch: a refresh already under way is let finish and dropped.
            self.refresher.drop_pending(plan.version + 1)
            boundary = Boundary()
        else:
            boundary = self.adopt_next_plan(epoch)
        if self.rank == 0:
            assert state.plan is not None
            next_plan = None if state.history.stopped_early else state.plan
            print(
                self.progress.epoch_line(
                    epoch,
                    epoch_loss,
                    plan=plan,
                    seconds=epoch_seconds,
                    next_plan=next_plan,
                    boundary=boundary,
                ),
                flush=True,
            )
            if state.history.stopped_early:
                print(self.progress.early_stop_line(epoch, state.history, self.cfg.eval.patience), flush=True)
        if not asks_miner:
            self.checkpoint(float(state.epoch), None)

    def stops_early(self) -> bool:
        """Whether ``eval.patience`` ends the run at this epoch end: the last ``patience``
        evaluations did not beat the best. Rank 0 decides (only it holds the scores) and
        every rank learns it."""
        patience = self.cfg.eval.patience
        if not patience or self.evaluator is None:
            return False
        return bool(from_rank0(self.rank == 0 and self.state.history.evaluations_since_best() >= patience))

    def adopt_next_plan(self, epoch: int) -> Boundary:
        """Get the plan that follows epoch ``epoch`` (0-based) from the refresher and make it
        the current one (:func:`~pipeline.training.refresh.adopt_plan`)."""
        adopted = self.refresher.next_plan(epoch, self.state, self.model)
        return adopt_plan(self.state, adopted, self.logger, refresh_waits=self.refresher.waits)

    def evaluate(self, epoch: float) -> None:
        """Evaluate (every rank) at ``epoch``; see :meth:`EvalRecorder.evaluate`."""
        assert self.evaluator is not None
        self.evaluator.evaluate(self.state, epoch)

    def checkpoint(self, epoch: float, augment_rng: np.random.Generator | None) -> None:
        """Report a checkpoint (every rank); mid-epoch (``augment_rng`` given) with every rank's
        random state. See :meth:`CheckpointReporter.report`."""
        self.state.history.miner_restarts = self.refresher.restarts
        if self.refresher.miner_pid is not None:
            job = ray.get_runtime_context().get_job_id()
            self.state.history.miner_seen = [job, self.refresher.miner_pid]
        self.checkpoints.report(self.state, epoch, augment_rng)

    def close(self) -> None:
        """Send rank 0's remaining metrics (warning about any that could not be sent), then
        wait for every rank, so that no worker leaves while another still reports."""
        if self.logger is not None:
            unsent = self.logger.close(DRAIN_TIMEOUT_S)
            if unsent:
                print(
                    f"[mlflow] warning: {unsent} metric values and tags could not be sent within "
                    f"{DRAIN_TIMEOUT_S:g}s",
                    flush=True,
                )
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
