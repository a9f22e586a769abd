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

import random
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.batching.plan import BatchPlan, padding_share, worker_slices
from pipeline.config.schema import Config
from pipeline.core.seams import hold_once
from pipeline.evaluation.in_training import EvalOutcome
from pipeline.model.encoder import SentenceEncoder
from pipeline.model.flops import CountingEncoder, EncoderFlops, device_peak_tflops
from pipeline.model.folders import quiet_libraries
from pipeline.training.contract import LoopConfig, miner_inputs
from pipeline.training.debias import false_negative_mask
from pipeline.training.miner_client import MinerClient
from pipeline.training.refresh import Boundary, PlanRefresher
from pipeline.training.refresh_policy import RefreshSettings
from pipeline.training.resume import find_resume_point
from pipeline.training.state import TrainState, restore_rng
from pipeline.training.step import GlobalBatch, TrainStep, make_train_step
from pipeline.training.worker_reports import CheckpointReporter, EvalRecorder
from pipeline.training.worker_setup import (
    build_evaluator,
    build_model,
    build_optimizer,
    fetch_inputs,
    initial_state,
    open_logger,
    system_metrics_monitor,
)

PROGRESS_EVERY_S = 30.0


def train_loop_per_worker(loop_config: LoopConfig) -> None:
    """Ray Train entry point: runs on every worker. The first worker on each node also logs
    the node's system metrics (``tracking.system_metrics``) while it trains."""
    import ray.train

    ctx = ray.train.get_context()
    with system_metrics_monitor(loop_config, ctx):
        worker = SimCSEWorker.setup(loop_config, ctx)
        worker.start()
        for epoch in range(worker.state.epoch, loop_config.config.train.epochs):
            worker.run_epoch(epoch)
            worker.end_epoch(epoch)
        worker.close()


def _seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Dropout randomness from (seed, rank, epoch): ranks differ, and a run resumed at an
    epoch boundary draws exactly what the uninterrupted run would have drawn."""
    torch.manual_seed(seed + 1_000_003 * rank + 7919 * epoch)
    random.seed(seed + rank + epoch)


class SimCSEWorker:
    """One DDP rank's training: the model, optimizer, schedule and :class:`TrainState`, the
    plan refresher, the evaluator and (rank 0) the metric logger.

    :meth:`setup` builds it (resuming from the latest checkpoint if there is one),
    :meth:`start` catches up on what a checkpoint left open, then per epoch
    :meth:`run_epoch` trains its batches and :meth:`end_epoch` evaluates, checkpoints and
    adopts the next plan; :meth:`close` ends it.
    """

    def __init__(
        self,
        cfg: Config,
        rank: int,
        world: int,
        model: SentenceEncoder,
        ddp_model: Any,
        train_step: TrainStep,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        state: TrainState,
        lengths: np.ndarray,
        refresher: PlanRefresher,
        evaluator: EvalRecorder | None,
        checkpoints: CheckpointReporter,
        logger: Any,
        peak_tflops: float | None = None,
    ):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.model, self.train_step = model, train_step
        self.optimizer, self.scheduler = optimizer, scheduler
        self.state = state
        self.lengths = lengths
        """Tokens per training row (for the plan's padding share)."""
        self.refresher, self.evaluator, self.checkpoints = refresher, evaluator, checkpoints
        self.logger = logger
        """Rank 0's metric logger; None on the other ranks and in runs without tracking."""
        self.counted_model = CountingEncoder(ddp_model, EncoderFlops.of(model))
        """What the train step calls: the DDP model, counting the tokens and FLOPs it encodes."""
        self.peak_tflops = peak_tflops
        """The device's peak for ``train/mfu`` (None: no MFU logged)."""
        # The epoch in progress: its augmentation generator (set by run_epoch), the start of
        # its current timed segment (restarted by each mid-epoch checkpoint, so checkpoint
        # time stays out of the epoch's time) and the batch that segment started at, its
        # first batch in this run, and when rank 0 last printed progress.
        self.augment_rng = np.random.default_rng()
        self.segment_start = self.last_progress = 0.0
        self.segment_first_batch = 0
        self.first_batch = 0

    @classmethod
    def setup(cls, loop_config: LoopConfig, ctx: Any) -> SimCSEWorker:
        """Everything for this rank to train, from the driver's inputs and the Ray Train
        context; from the latest complete checkpoint when the run resumes."""
        import ray.train.torch

        cfg = loop_config.config
        quiet_libraries()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        device = ray.train.torch.get_device()
        inputs = fetch_inputs(loop_config)
        resume = find_resume_point()
        model = build_model(cfg, resume.model_dir if resume is not None else inputs.model_dir, device)
        optimizer, scheduler = build_optimizer(cfg, model, inputs.num_rows)
        state, best_dir = initial_state(cfg, inputs.lengths, resume, model, optimizer, scheduler, rank)
        ddp_model = ray.train.torch.prepare_model(model, move_to_device=False)
        logger = open_logger(loop_config, rank, state, resumed=resume is not None)
        client = None
        if loop_config.miner is not None and cfg.mining.mines:
            client = MinerClient(
                loop_config.miner,
                RefreshSettings.from_config(cfg),
                logger,
                restarts=state.history.miner_restarts,
                miner_pid=loop_config.miner_pid,
                inputs=miner_inputs(loop_config.corpus_ref, loop_config.model_ref, loop_config.triplets_ref),
            )
        refresher = PlanRefresher(cfg, rank, inputs.lengths, client)
        sts = build_evaluator(loop_config, inputs.corpus, rank, world, device)
        max_seq_len = cfg.data.max_seq_len
        return cls(
            cfg, rank, world, model, ddp_model,
            make_train_step(cfg, inputs.corpus, inputs.triplets, device),
            optimizer, scheduler, state, inputs.lengths, refresher,
            EvalRecorder(sts, model, inputs.tokenizer, best_dir, max_seq_len, logger) if sts is not None else None,
            CheckpointReporter(
                model, inputs.tokenizer, optimizer, scheduler, best_dir, max_seq_len, rank, world, logger
            ),
            logger,
            device_peak_tflops(device, cfg.train.peak_tflops),
        )  # fmt: skip

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
            boundary = self.adopt_initial_plan()
            if self.rank == 0:
                print(
                    f"[train] negatives mined with the starting weights: plan v{state.plan.version} "
                    f"(waited {boundary.wait_seconds:.1f}s)",
                    flush=True,
                )
        if self.evaluator is not None and state.step == 0:
            self.evaluate(0)

    def run_epoch(self, epoch: int) -> None:
        """Train epoch ``epoch`` (0-based) on the current plan, from the batch the state is at,
        with the mid-epoch evaluations and checkpoints the config asks for."""
        plan = self.state.plan
        assert plan is not None
        self.first_batch = self.state.batches_done
        self.augment_rng = self.seed_epoch(epoch)
        if self.logger is not None:
            # A hash or a name is no quantity to chart: the plan's fingerprint and the sampler
            # that made it are tags per epoch.
            self.logger.set_tags(
                {
                    f"plan.fingerprint.epoch_{epoch + 1}": plan.hex_fingerprint(),
                    f"plan.sampler.epoch_{epoch + 1}": plan.sampler,
                }
            )
            self.logger.log(
                {"train/padding_share": padding_share(plan, self.lengths, self.world)}, self.state.step
            )
        self.model.train()
        self.segment_start = self.last_progress = time.perf_counter()
        self.segment_first_batch = self.first_batch
        self.refresher.after_step(epoch, self.first_batch, plan, self.state.step, self.model)
        for batch_index in range(self.first_batch, plan.num_batches):
            if self.rank == 0:
                hold_once("train_step", self.state.step + 1)
            self.train_batch(batch_index)
            self.refresher.after_step(epoch, batch_index + 1, plan, self.state.step, self.model)
            outcome = self.maybe_eval(epoch)
            self.maybe_checkpoint(epoch, outcome)
            self.print_progress(epoch)

    def seed_epoch(self, epoch: int) -> np.random.Generator:
        """Seed dropout and Python's random for the epoch's part this run trains, and return
        its augmentation generator.

        From the epoch's start: seeded from (seed, rank, epoch). Mid-epoch, from a checkpoint
        of as many workers: every generator as the checkpoint captured it, so the redone
        steps repeat the lost ones. On another number of workers: a fresh but still seeded
        stream."""
        seed, rank, first_batch = self.cfg.run.seed, self.rank, self.first_batch
        augment_rng = np.random.default_rng([seed, rank, epoch])
        saved = self.state.rng
        if first_batch == 0:
            _seed_epoch(seed, rank, epoch)
        elif saved is not None and len(saved) == self.world:
            restore_rng(saved[rank], augment_rng)
        else:
            _seed_epoch(seed, rank, epoch + 104_729 * first_batch)
            augment_rng = np.random.default_rng([seed, rank, epoch, first_batch])
        self.state.rng = None
        return augment_rng

    def train_batch(self, batch_index: int) -> None:
        """One optimizer step on the plan's batch ``batch_index``; logs its loss, learning rate
        and throughput (rank 0)."""
        state, cfg = self.state, self.cfg
        assert state.plan is not None
        step_start = time.perf_counter()
        global_rows = state.plan.batch(batch_index)
        batch = GlobalBatch(
            global_rows,
            worker_slices(len(global_rows), self.world),
            self.rank,
            state.plan.negatives,
            # Every rank holds the same plan, so every rank builds the same mask of the
            # global batch (None on epoch 1's random plan, or without mining.debias).
            false_negative_mask(global_rows, state.plan, cfg.mining.debias),
        )
        loss, loss_to_backward = self.train_step(self.counted_model, batch, self.augment_rng)
        self.optimizer.zero_grad(set_to_none=True)
        loss_to_backward.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        state.step += 1
        state.batches_done = batch_index + 1
        loss_value = float(loss.detach())  # waits for the step's device work
        elapsed = max(time.perf_counter() - step_start, 1e-9)
        tokens, flops = self.counted_model.take()
        state.loss_sum += loss_value
        if self.logger is not None:
            metrics = {
                "train/loss": loss_value,
                "train/learning_rate": self.scheduler.get_last_lr()[0],
                "train/sentences_per_s": len(global_rows) / elapsed,
                # This rank's share: the tokens its encoder ran (both views, or the triplet's texts).
                "train/tokens_per_s": tokens / elapsed,
            }
            if self.peak_tflops:
                metrics["train/mfu"] = flops / elapsed / (self.peak_tflops * 1e12)
            self.logger.log(metrics, state.step)
            if state.step % cfg.train.log_every == 0:
                self.logger.flush()

    def _inside_epoch(self) -> bool:
        assert self.state.plan is not None
        return self.state.batches_done < self.state.plan.num_batches

    def maybe_eval(self, epoch: int) -> EvalOutcome | None:
        """Evaluate inside the epoch every ``eval.every_steps`` steps (the epoch's end has its own)."""
        every, state = self.cfg.eval.every_steps, self.state
        if self.evaluator is None or not every or state.step % every or not self._inside_epoch():
            return None
        assert state.plan is not None
        # The evaluator puts the model back in train mode itself.
        return self.evaluate(epoch + state.batches_done / state.plan.num_batches)

    def maybe_checkpoint(self, epoch: int, outcome: EvalOutcome | None) -> None:
        """Checkpoint inside the epoch every ``checkpoint.every_steps`` steps, with every rank's
        random state (the epoch's end has its own checkpoint)."""
        every, state = self.cfg.checkpoint.every_steps, self.state
        if not every or state.step % every or not self._inside_epoch():
            return
        assert state.plan is not None
        now = time.perf_counter()
        state.epoch_seconds += now - self.segment_start
        self.segment_start, self.segment_first_batch = now, state.batches_done
        self.checkpoint(
            epoch + state.batches_done / state.plan.num_batches,
            self.augment_rng,
            outcome.whitening if outcome is not None else None,
        )

    def print_progress(self, epoch: int) -> None:
        """Rank 0: a ``[train]`` line with the epoch's running loss every ``PROGRESS_EVERY_S``."""
        if self.rank != 0 or time.perf_counter() - self.last_progress <= PROGRESS_EVERY_S:
            return
        state = self.state
        assert state.plan is not None
        self.last_progress = time.perf_counter()
        done = state.batches_done - self.segment_first_batch  # the rate of the segment's steps
        rate = done * self.cfg.train.batch_size / (self.last_progress - self.segment_start + 1e-9)
        print(
            f"[train] epoch {epoch + 1}/{self.cfg.train.epochs} step {state.batches_done}/{state.plan.num_batches}: "
            f"loss {state.loss_sum / state.batches_done:.4f}, {rate:.0f} sentences/s",
            flush=True,
        )

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
        self.refresher.start_boundary_refresh(epoch, plan, state.step, self.model)
        outcome = self.evaluate(epoch + 1) if self.evaluator is not None else None
        whitening = outcome.whitening if outcome is not None else None
        state.epoch = epoch + 1
        state.batches_done, state.loss_sum, state.epoch_seconds = 0, 0.0, 0.0
        if self.logger is not None:
            self.logger.log(
                {
                    "train/epoch_loss": epoch_loss,
                    "train/plan_version": float(plan.version),
                    "train/epoch_seconds": epoch_seconds,
                    "train/epoch": float(epoch + 1),
                },
                state.step,
            )
        asks_miner = self.refresher.asks_miner(epoch)
        if asks_miner:
            state.plan_pending = True
            self.checkpoint(float(state.epoch), None, whitening)
        boundary = self.adopt_next_plan(epoch)
        if self.rank == 0:
            print(
                f"[train] epoch {epoch + 1}/{self.cfg.train.epochs}: loss {epoch_loss:.4f} over {plan.num_batches} "
                f"steps on plan v{plan.version}, {epoch_seconds:.1f}s; next plan v{state.plan.version} "
                f"(waited {boundary.wait_seconds:.1f}s, staleness {boundary.staleness_steps} steps"
                f"{'; the refresh under way was not ready: plan kept, reshuffled' if boundary.late else ''})",
                flush=True,
            )
        if not asks_miner:
            self.checkpoint(float(state.epoch), None, whitening)

    def adopt_initial_plan(self) -> Boundary:
        """Pair mode, before epoch 1: adopt the plan mined with the starting weights."""
        return self._adopt(*self.refresher.initial_plan(self.state, self.model))

    def adopt_next_plan(self, epoch: int) -> Boundary:
        """Get the plan that follows epoch ``epoch`` (0-based) from the refresher and make it
        the current one, with the boundary's numbers recorded and logged."""
        return self._adopt(*self.refresher.next_plan(epoch, self.state, self.model))

    def _adopt(self, next_plan: BatchPlan, boundary: Boundary) -> Boundary:
        state = self.state
        state.history.wait_seconds.append(boundary.wait_seconds)
        state.history.refresh_seconds.append(boundary.refresh_seconds)
        state.history.staleness_steps.append(boundary.staleness_steps)
        state.plan, state.plan_pending = next_plan, False
        if self.logger is not None:
            self.logger.log(
                {
                    "mining/refresh_wait_s": boundary.wait_seconds,
                    "mining/next_plan_staleness_steps": float(boundary.staleness_steps),
                    "mining/refresh_late": float(boundary.late),
                },
                state.step,
            )
            self.logger.flush()
        return boundary

    def evaluate(self, epoch: float) -> EvalOutcome | None:
        """Evaluate (every rank) at ``epoch``; see :meth:`EvalRecorder.evaluate`."""
        assert self.evaluator is not None
        return self.evaluator.evaluate(self.state, epoch)

    def checkpoint(self, epoch: float, augment_rng: np.random.Generator | None, whitening: Any) -> None:
        """Report a checkpoint (every rank); mid-epoch (``augment_rng`` given) with every rank's
        random state. See :meth:`CheckpointReporter.report`."""
        self.state.history.miner_restarts = self.refresher.restarts
        self.checkpoints.report(self.state, epoch, augment_rng, whitening)

    def close(self) -> None:
        """Send rank 0's remaining metrics (warning about any that could not be sent), then
        wait for every rank, so that no worker leaves while another still reports."""
        if self.logger is not None:
            timeout = self.cfg.tracking.drain_timeout_s
            unsent = self.logger.close(timeout)
            if unsent:
                print(
                    f"[mlflow] warning: {unsent} metric values and tags could not be sent within "
                    f"tracking.drain_timeout_s={timeout:g}s",
                    flush=True,
                )
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
