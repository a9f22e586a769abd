"""The per-worker SimCSE train loop and its Ray Train ``TorchTrainer``.

One ``fit()`` runs every epoch (each ``fit`` costs ~20 s of start-up). At each epoch end
rank 0 hands the newest encoder weights to the miner actor, broadcasts the returned plan to
the other ranks, and every rank reports a checkpoint (see :mod:`pipeline.checkpoint`);
``checkpoint.every_steps`` adds checkpoints inside an epoch. Ray Train restarts a failed
worker group from the latest checkpoint (``train.max_failures``), and a job started again
with the same run name resumes from it: at the same step, on the same plan, with every
rank's random state restored, so the redone steps repeat the lost ones exactly.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.batching.plan import balanced_batch_sizes, padding_share, worker_slices
from pipeline.config.schema import Config
from pipeline.data.tokenized import TokenizedCorpus, row_lengths
from pipeline.evaluation.in_training import EvalOutcome, TrainingEvaluator, eval_metric_names
from pipeline.evaluation.whitening import save_whitening
from pipeline.model.accel import autocast, enable_tf32, fused_adamw, to_device
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer, quiet_libraries, save_model_dir, unpack_dir
from pipeline.training.checkpoint import save_checkpoint
from pipeline.training.contract import LoopConfig, report_metrics
from pipeline.training.losses import global_batch_simcse_loss
from pipeline.training.refresh import Boundary, PlanRefresher, random_batches
from pipeline.training.resume import find_resume_point
from pipeline.training.state import BestModel, TrainState, capture_rng, restore_rng
from pipeline.training.step import triplet_batch_loss, two_views

PROGRESS_EVERY_S = 30.0


def _seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Dropout randomness from (seed, rank, epoch): ranks differ, and a run resumed at an
    epoch boundary draws exactly what the uninterrupted run would have drawn."""
    torch.manual_seed(seed + 1_000_003 * rank + 7919 * epoch)
    random.seed(seed + rank + epoch)


def train_loop_per_worker(loop_config: LoopConfig) -> None:
    """Ray Train entry point: runs on every worker. The first worker on each node also logs
    the node's system metrics (``tracking.system_metrics``) while it trains."""
    import contextlib

    import ray.train

    cfg = loop_config.config
    ctx = ray.train.get_context()
    monitor: Any = contextlib.nullcontext()
    if cfg.tracking.system_metrics and loop_config.run_id and ctx.get_local_rank() == 0:
        from pipeline.tracking.system import system_metrics

        several_nodes = ctx.get_local_world_size() < ctx.get_world_size()
        monitor = system_metrics(
            loop_config.tracking_uri,
            loop_config.run_id,
            cfg.tracking.system_metrics_interval_s,
            node_id=f"node_{ctx.get_node_rank()}" if several_nodes else None,
        )
    with monitor:
        _train_on_worker(loop_config, cfg, ctx)


def _train_on_worker(loop_config: LoopConfig, cfg: Config, ctx: Any) -> None:
    """The worker's training, given the config and Ray Train context its entry point read."""
    import ray
    import ray.train.torch
    import torch.distributed as dist
    from transformers import get_linear_schedule_with_warmup

    quiet_libraries()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()

    model_dir = unpack_dir(ray.get(loop_config.model_ref))
    tokenizer = load_tokenizer(model_dir)
    corpus = TokenizedCorpus(ray.get(loop_config.corpus_ref), tokenizer.pad_token_id)
    triplets = ray.get(loop_config.triplets_ref) if loop_config.triplets_ref is not None else None
    num_rows = len(triplets) if triplets is not None else len(corpus)
    miner = loop_config.miner

    resume = find_resume_point()
    # Same initial weights on every rank: they come from one folder (and the MLP head from
    # one seed), so DDP starts consistent without a broadcast.
    torch.manual_seed(cfg.run.seed)
    model = load_sentence_encoder(
        resume.model_dir if resume is not None else model_dir,
        pooler=cfg.model.pooler,
        use_mlp=cfg.use_mlp,
        dropout=cfg.model.dropout,
    )
    model.to(device)
    enable_tf32(device)
    if cfg.train.compile:
        # In place: the state_dict keys (checkpoints, export) and DDP wrapping stay as they are.
        model.compile()

    total_steps = len(balanced_batch_sizes(num_rows, cfg.train.batch_size)) * cfg.train.epochs
    optimizer = fused_adamw(model, cfg.train.lr, cfg.train.weight_decay)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(cfg.train.warmup_ratio * total_steps), total_steps
    )

    lengths = row_lengths(corpus, triplets)
    state = TrainState(plan=random_batches(cfg, cfg.run.seed, lengths))
    # Rank 0's copy of the best evaluated model, carried into every checkpoint.
    best_dir = Path(tempfile.mkdtemp(prefix="simcse-best-")) / "model"
    if resume is not None:
        state = resume.state
        if model.mlp is not None and resume.extras["mlp"] is not None:
            model.mlp.load_state_dict(resume.extras["mlp"])
        optimizer.load_state_dict(resume.extras["optimizer"])
        scheduler.load_state_dict(resume.extras["scheduler"])
        if resume.best_dir is not None:
            best_dir = resume.best_dir
        assert state.plan is not None
        if rank == 0:
            where = (
                f"in epoch {state.epoch + 1} after batch {state.batches_done}/{state.plan.num_batches}"
                if state.batches_done
                else f"after epoch {state.epoch}"
            )
            print(
                f"[train] resumed at step {state.step}, {where} "
                f"(plan v{state.plan.version}, fingerprint {state.plan.hex_fingerprint()})",
                flush=True,
            )

    ddp_model = ray.train.torch.prepare_model(model, move_to_device=False)
    logger = None
    if rank == 0 and loop_config.run_id:
        from pipeline.tracking.metric_logger import MetricLogger

        logger = MetricLogger(loop_config.tracking_uri, loop_config.run_id, cfg.tracking.flush_every_s)
        if resume is not None and state.step > 0:
            logger.log({"train/resumed_at_step": float(state.step)}, state.step)

    refresher = PlanRefresher(
        cfg,
        miner,
        rank,
        lengths,
        logger,
        restarts=state.history.miner_restarts,
        miner_pid=loop_config.miner_pid,
    )
    evaluator = None
    if loop_config.eval_ref is not None:
        evaluator = TrainingEvaluator(
            cfg.eval, ray.get(loop_config.eval_ref), corpus, cfg.run.seed, rank, world, device
        )

    def run_eval(epoch: float) -> EvalOutcome | None:
        assert evaluator is not None
        started = time.perf_counter()
        outcome = evaluator.evaluate(model)
        if outcome is None:
            return None
        metrics = outcome.metrics()
        state.history.evaluations.append({"epoch": float(epoch), "step": float(state.step), **metrics})
        # The starting model is scored (the "before") but never exported: the job ships a trained model.
        if epoch > 0 and (state.history.best is None or outcome.selection_score > state.history.best.score):
            state.history.best = BestModel(outcome.selection_score, float(epoch), state.step)
            shutil.rmtree(best_dir, ignore_errors=True)
            save_model_dir(model, tokenizer, best_dir, cfg.data.max_seq_len)
            if outcome.whitening is not None:
                save_whitening(outcome.whitening, best_dir)
        if logger is not None:
            logger.log(
                {**eval_metric_names(metrics), "eval/seconds": time.perf_counter() - started}, state.step
            )
            logger.flush()
        first = outcome.scores[0]
        whitened = f" ({first.spearman_whitened:.2f} whitened)" if first.spearman_whitened is not None else ""
        print(
            f"[eval] epoch {epoch:g} step {state.step}: {first.name} spearman {first.spearman:.2f}{whitened}, "
            f"alignment {first.alignment:.3f}, uniformity {first.uniformity:.3f} "
            f"({time.perf_counter() - started:.1f}s)",
            flush=True,
        )
        return outcome

    def report(epoch: float, augment_rng: np.random.Generator | None, whitening: Any) -> None:
        """Checkpoint on every rank (``ray.train.report`` is a barrier); rank 0 writes it.

        Mid-epoch (``augment_rng`` given) every rank's random state goes in, so a resumed
        run draws the same dropout masks and repetitions as the lost one."""
        state.rng = None
        if augment_rng is not None:
            mine = capture_rng(augment_rng)
            if world > 1:
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, mine)
                state.rng = gathered
            else:
                state.rng = [mine]
        state.history.miner_restarts = refresher.restarts
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                if logger is not None:
                    # Send what is buffered now; what the server does not take in time travels
                    # in the checkpoint and is sent again by whoever resumes from it.
                    logger.wait_sent(timeout=2.0)
                    state.unsent_metrics = logger.unsent()
                save_checkpoint(
                    Path(tmp), model, tokenizer, optimizer, scheduler, state, cfg.data.max_seq_len,
                    whitening=whitening, best_dir=best_dir,
                )  # fmt: skip
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(report_metrics(state, epoch), checkpoint=ckpt)
        state.rng = None

    def adopt_next_plan(epoch: int) -> Boundary:
        """Get the plan that follows epoch ``epoch`` (0-based) from the refresher and make it
        the current one, with the boundary's numbers recorded and logged."""
        next_plan, boundary = refresher.next_plan(epoch, state, model)
        state.history.wait_seconds.append(boundary.wait_seconds)
        state.history.refresh_seconds.append(boundary.refresh_seconds)
        state.history.staleness_steps.append(boundary.staleness_steps)
        state.plan, state.plan_pending = next_plan, False
        if logger is not None:
            logger.log(
                {
                    "mining/refresh_wait_s": boundary.wait_seconds,
                    "mining/next_plan_version": float(next_plan.version),
                    "mining/next_plan_staleness_steps": float(boundary.staleness_steps),
                    "mining/refresh_late": float(boundary.late),
                },
                state.step,
            )
            logger.flush()
        return boundary

    if logger is not None and state.unsent_metrics:
        logger.requeue(state.unsent_metrics)
    state.unsent_metrics = []
    if state.plan_pending:
        # Resumed from an epoch-end checkpoint written before its refresh came back: the
        # refresh is asked again, from the same weights.
        boundary = adopt_next_plan(state.epoch - 1)
        if rank == 0:
            print(
                f"[train] epoch {state.epoch} was checkpointed before its refresh; next plan "
                f"v{state.plan.version} (waited {boundary.wait_seconds:.1f}s)",
                flush=True,
            )
    if evaluator is not None and state.step == 0:
        run_eval(0)  # the starting model: the "before" of every comparison
    for epoch in range(state.epoch, cfg.train.epochs):
        assert state.plan is not None
        plan = state.plan
        first_batch = state.batches_done
        augment_rng = np.random.default_rng([cfg.run.seed, rank, epoch])
        if first_batch == 0:
            _seed_epoch(cfg.run.seed, rank, epoch)
        elif state.rng is not None and len(state.rng) == world:
            restore_rng(state.rng[rank], augment_rng)
        else:
            # Resumed on a different number of workers: a fresh but still seeded stream.
            _seed_epoch(cfg.run.seed, rank, epoch + 104_729 * first_batch)
            augment_rng = np.random.default_rng([cfg.run.seed, rank, epoch, first_batch])
        state.rng = None
        if logger is not None:
            # A hash is no quantity to chart: the plan's fingerprint is a tag per epoch.
            logger.set_tags({f"plan.fingerprint.epoch_{epoch + 1}": plan.hex_fingerprint()})
            logger.log({"data/padding_share": padding_share(plan, lengths, world)}, state.step)
        model.train()
        segment_start = time.perf_counter()
        last_progress = segment_start
        refresher.after_step(epoch, first_batch, plan, state.step, model)
        for batch_index in range(first_batch, plan.num_batches):
            step_start = time.perf_counter()
            global_rows = plan.batch(batch_index)
            sizes = worker_slices(len(global_rows), world)
            lo = sum(sizes[:rank])
            local_rows = global_rows[lo : lo + sizes[rank]]
            if triplets is None:
                input_ids, mask = two_views(corpus, local_rows, cfg.train.dup_rate, augment_rng)
                with autocast(device):
                    # Both dropout views in one forward pass: the batch twice, stacked.
                    embeddings = ddp_model(to_device(input_ids, device), to_device(mask, device))
                view1, view2 = embeddings.float().split(len(local_rows))
                loss, loss_to_backward = global_batch_simcse_loss(
                    view1,
                    view2,
                    sizes,
                    to_device(corpus.ids[global_rows], device),
                    cfg.train.temperature,
                )
            else:
                loss, loss_to_backward = triplet_batch_loss(
                    ddp_model, corpus, triplets, plan.negatives, local_rows, global_rows, sizes, cfg, device
                )
            optimizer.zero_grad(set_to_none=True)
            loss_to_backward.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
            optimizer.step()
            scheduler.step()
            state.step += 1
            state.batches_done = batch_index + 1
            loss_value = float(loss.detach())
            state.loss_sum += loss_value
            if logger is not None:
                elapsed = time.perf_counter() - step_start
                logger.log(
                    {
                        "train/loss": loss_value,
                        "train/learning_rate": scheduler.get_last_lr()[0],
                        "train/sentences_per_s": len(global_rows) / max(elapsed, 1e-9),
                    },
                    state.step,
                )
                if state.step % cfg.train.log_every == 0:
                    logger.flush()
            refresher.after_step(epoch, batch_index + 1, plan, state.step, model)
            inside_epoch = batch_index + 1 < plan.num_batches
            outcome = None
            if (
                evaluator is not None
                and cfg.eval.every_steps
                and state.step % cfg.eval.every_steps == 0
                and inside_epoch
            ):
                outcome = run_eval(epoch + (batch_index + 1) / plan.num_batches)  # restores train mode itself
            if cfg.checkpoint.every_steps and state.step % cfg.checkpoint.every_steps == 0 and inside_epoch:
                now = time.perf_counter()
                state.epoch_seconds += now - segment_start
                segment_start = now
                report(
                    epoch + state.batches_done / plan.num_batches,
                    augment_rng,
                    outcome.whitening if outcome is not None else None,
                )
            if rank == 0 and time.perf_counter() - last_progress > PROGRESS_EVERY_S:
                last_progress = time.perf_counter()
                done = batch_index + 1 - first_batch
                rate = done * cfg.train.batch_size / (last_progress - segment_start + 1e-9)
                print(
                    f"[train] epoch {epoch + 1}/{cfg.train.epochs} step {batch_index + 1}/{plan.num_batches}: "
                    f"loss {state.loss_sum / (batch_index + 1):.4f}, {rate:.0f} sentences/s",
                    flush=True,
                )

        epoch_loss = state.loss_sum / plan.num_batches
        state.history.epoch_losses.append(epoch_loss)
        state.history.plan_versions.append(plan.version)
        epoch_seconds = state.epoch_seconds + time.perf_counter() - segment_start
        refresher.start_boundary_refresh(epoch, plan, state.step, model)
        outcome = run_eval(epoch + 1) if evaluator is not None else None
        whitening = outcome.whitening if outcome is not None else None
        state.epoch = epoch + 1
        state.batches_done, state.loss_sum, state.epoch_seconds = 0, 0.0, 0.0
        if logger is not None:
            logger.log(
                {
                    "train/epoch_loss": epoch_loss,
                    "train/plan_version": float(plan.version),
                    "train/epoch_seconds": epoch_seconds,
                    "train/epoch": float(epoch + 1),
                },
                state.step,
            )
        asks_miner = refresher.asks_miner(epoch)
        if asks_miner:
            # The finished epoch is checkpointed before the wait for the miner: a miner that
            # fails or hangs now costs a refresh (redone on resume), never the epoch.
            state.plan_pending = True
            report(float(state.epoch), None, whitening)
        boundary = adopt_next_plan(epoch)
        if rank == 0:
            print(
                f"[train] epoch {epoch + 1}/{cfg.train.epochs}: loss {epoch_loss:.4f} over {plan.num_batches} steps "
                f"on plan v{plan.version}, {epoch_seconds:.1f}s; next plan v{state.plan.version} "
                f"(waited {boundary.wait_seconds:.1f}s, staleness {boundary.staleness_steps} steps)",
                flush=True,
            )
        if not asks_miner:
            report(float(state.epoch), None, whitening)
    if logger is not None:
        unsent = logger.close(cfg.tracking.drain_timeout_s)
        if unsent:
            print(
                f"[mlflow] warning: {unsent} metric values and tags could not be sent within "
                f"tracking.drain_timeout_s={cfg.tracking.drain_timeout_s:g}s",
                flush=True,
            )
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
