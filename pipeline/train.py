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

import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.accel import autocast, enable_tf32, fused_adamw, to_device
from pipeline.augment import repeat_words
from pipeline.checkpoint import (
    MODEL_SUBDIR,
    BestModel,
    TrainState,
    capture_rng,
    checkpoint_problem,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from pipeline.config import Config, config_from_dict
from pipeline.data import TokenizedCorpus, Triplets, row_lengths
from pipeline.errors import UnrecoverableError, first_line
from pipeline.losses import gather_across_workers, global_batch_simcse_loss, simcse_loss
from pipeline.model import (
    SentenceEncoder,
    cpu_state_dict,
    load_sentence_encoder,
    load_tokenizer,
    quiet_libraries,
    save_model_dir,
    unpack_dir,
)
from pipeline.plans import BatchPlan, balanced_batch_sizes, padding_share, random_plan, worker_slices
from pipeline.training_eval import EvalOutcome, TrainingEvaluator, eval_metric_names
from pipeline.whitening import save_whitening

PROGRESS_EVERY_S = 30.0


def _seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Dropout randomness from (seed, rank, epoch): ranks differ, and a run resumed at an
    epoch boundary draws exactly what the uninterrupted run would have drawn."""
    torch.manual_seed(seed + 1_000_003 * rank + 7919 * epoch)
    random.seed(seed + rank + epoch)


@dataclass
class ResumePoint:
    """A verified checkpoint, read into memory and local folders."""

    state: TrainState
    extras: dict[str, Any]
    """``mlp``, ``optimizer`` and ``scheduler`` state dicts."""
    model_dir: Path
    best_dir: Path | None
    """Local copy of the best evaluated model, when the checkpoint names one."""


def find_resume_point() -> ResumePoint | None:
    """The newest reported checkpoint whose files are complete, copied to local folders.

    Ray Train hands the latest registered checkpoint; should its files not match their
    manifest, older reported checkpoints are tried newest first (each skip is printed).
    """
    import ray.train

    from pipeline.checkpoint import BEST_SUBDIR

    latest = ray.train.get_checkpoint()
    if latest is None:
        return None
    candidates = [latest]
    seen = {latest.path}
    for problem_round in range(2):
        for checkpoint in candidates:
            with checkpoint.as_directory() as ckpt_dir:
                folder = Path(ckpt_dir)
                problem = checkpoint_problem(folder)
                if problem is not None:
                    print(f"[train] skipping checkpoint {checkpoint.path}: {problem}", flush=True)
                    continue
                state, extras = load_checkpoint(folder)
                local = Path(tempfile.mkdtemp(prefix="simcse-resume-"))
                shutil.copytree(folder / MODEL_SUBDIR, local / MODEL_SUBDIR)
                best_dir = None
                if state.best is not None:
                    source = (
                        folder / BEST_SUBDIR if (folder / BEST_SUBDIR).is_dir() else folder / MODEL_SUBDIR
                    )
                    best_dir = local / BEST_SUBDIR
                    shutil.copytree(source, best_dir)
                return ResumePoint(state, extras, local / MODEL_SUBDIR, best_dir)
        if problem_round == 0:
            reported = ray.train.get_all_reported_checkpoints(timeout_s=600)
            older = [r for r in reported if r.checkpoint.path not in seen]
            older.sort(key=lambda r: r.metrics.get("step", -1), reverse=True)
            candidates = [r.checkpoint for r in older]
    raise RuntimeError("no complete checkpoint to resume from: every reported checkpoint failed verification")


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: runs on every worker. The first worker on each node also logs
    the node's system metrics (``tracking.system_metrics``) while it trains."""
    import contextlib

    import ray.train

    cfg: Config = config_from_dict(loop_config["config"])
    ctx = ray.train.get_context()
    monitor: Any = contextlib.nullcontext()
    if cfg.tracking.system_metrics and loop_config.get("run_id") and ctx.get_local_rank() == 0:
        from pipeline.tracking import system_metrics

        several_nodes = ctx.get_local_world_size() < ctx.get_world_size()
        monitor = system_metrics(
            loop_config["tracking_uri"],
            loop_config["run_id"],
            cfg.tracking.system_metrics_interval_s,
            node_id=f"node_{ctx.get_node_rank()}" if several_nodes else None,
        )
    with monitor:
        _train_on_worker(loop_config, cfg, ctx)


def _train_on_worker(loop_config: dict[str, Any], cfg: Config, ctx: Any) -> None:
    """The worker's training, given the config and Ray Train context its entry point read."""
    import ray
    import ray.train.torch
    import torch.distributed as dist
    from transformers import get_linear_schedule_with_warmup

    quiet_libraries()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()

    model_dir = unpack_dir(ray.get(loop_config["model_ref"]))
    tokenizer = load_tokenizer(model_dir)
    corpus = TokenizedCorpus(ray.get(loop_config["corpus_ref"]), tokenizer.pad_token_id)
    triplets = ray.get(loop_config["triplets_ref"]) if loop_config.get("triplets_ref") is not None else None
    num_rows = len(triplets) if triplets is not None else len(corpus)
    miner = loop_config["miner"]

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
    if rank == 0 and loop_config.get("run_id"):
        from pipeline.tracking import MetricLogger

        logger = MetricLogger(loop_config["tracking_uri"], loop_config["run_id"], cfg.tracking.flush_every_s)
        if resume is not None and state.step > 0:
            logger.log({"train/resumed_at_step": float(state.step)}, state.step)

    refresher = PlanRefresher(
        cfg,
        miner,
        rank,
        lengths,
        logger,
        restarts=state.miner_restarts,
        miner_pid=loop_config.get("miner_pid"),
    )
    evaluator = None
    if loop_config.get("eval_ref") is not None:
        evaluator = TrainingEvaluator(
            cfg.eval, ray.get(loop_config["eval_ref"]), corpus, cfg.run.seed, rank, world, device
        )

    def run_eval(epoch: float) -> EvalOutcome | None:
        assert evaluator is not None
        started = time.perf_counter()
        outcome = evaluator.evaluate(model)
        if outcome is None:
            return None
        metrics = outcome.metrics()
        state.eval_history.append({"epoch": float(epoch), "step": float(state.step), **metrics})
        # The starting model is scored (the "before") but never exported: the job ships a trained model.
        if epoch > 0 and (state.best is None or outcome.selection_score > state.best.score):
            state.best = BestModel(outcome.selection_score, float(epoch), state.step)
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

    def report(metrics: dict[str, Any], augment_rng: np.random.Generator | None, whitening: Any) -> None:
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
        state.miner_restarts = refresher.restarts
        metrics = {**metrics, "miner_restarts": refresher.restarts}
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
            ray.train.report(metrics, checkpoint=ckpt)
        state.rng = None

    def adopt_next_plan(epoch: int) -> Boundary:
        """Get the plan that follows epoch ``epoch`` (0-based) from the refresher and make it
        the current one, with the boundary's numbers recorded and logged."""
        next_plan, boundary = refresher.next_plan(epoch, state, model)
        state.wait_seconds.append(boundary.wait_seconds)
        state.refresh_seconds.append(boundary.refresh_seconds)
        state.staleness_steps.append(boundary.staleness_steps)
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
                    {"epoch": epoch + state.batches_done / plan.num_batches, "step": state.step,
                     "train_loss": loss_value, "plan_version": plan.version},
                    augment_rng, outcome.whitening if outcome is not None else None,
                )  # fmt: skip
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
        state.epoch_losses.append(epoch_loss)
        state.plan_versions.append(plan.version)
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
            report(epoch_end_metrics(state, epoch_loss, outcome), None, whitening)
        boundary = adopt_next_plan(epoch)
        if rank == 0:
            print(
                f"[train] epoch {epoch + 1}/{cfg.train.epochs}: loss {epoch_loss:.4f} over {plan.num_batches} steps "
                f"on plan v{plan.version}, {epoch_seconds:.1f}s; next plan v{state.plan.version} "
                f"(waited {boundary.wait_seconds:.1f}s, staleness {boundary.staleness_steps} steps)",
                flush=True,
            )
        if not asks_miner:
            report(epoch_end_metrics(state, epoch_loss, outcome), None, whitening)
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


def triplet_batch_loss(
    ddp_model: Any,
    corpus: TokenizedCorpus,
    triplets: Triplets,
    mined: np.ndarray | None,
    local_rows: np.ndarray,
    global_rows: np.ndarray,
    sizes: list[int],
    cfg: Config,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Supervised SimCSE on this worker's triplet rows, negatives gathered from all workers.

    Each row's negatives are its given one (if any) and its mined ones (if a refresh has
    happened): ``1 + num_negatives`` slots, absent ones masked. Anchors, positives and the
    present negatives go through the encoder in one forward pass.

    Returns ``(loss, loss_to_backward)`` as :func:`global_batch_simcse_loss` does.
    """
    negatives = triplets.negative[local_rows][:, None]
    if mined is not None:
        negatives = np.concatenate([negatives, mined[local_rows]], axis=1)
    present = negatives >= 0
    texts = np.concatenate([triplets.anchor[local_rows], triplets.positive[local_rows], negatives[present]])
    input_ids, mask = corpus.batch(texts)
    with autocast(device):
        embeddings = ddp_model(to_device(input_ids, device), to_device(mask, device)).float()
    n = len(local_rows)
    present_t = to_device(present, device)
    negative_embeddings = embeddings.new_zeros((n, negatives.shape[1], embeddings.shape[1]))
    negative_embeddings[present_t] = embeddings[2 * n :]
    loss = simcse_loss(
        gather_across_workers(embeddings[:n], sizes),
        gather_across_workers(embeddings[n : 2 * n], sizes),
        temperature=cfg.train.temperature,
        hard_negatives=gather_across_workers(negative_embeddings, sizes),
        hard_negative_weight=cfg.train.hard_negative_weight,
        # Rows sharing a positive text (a premise with several hypotheses) are not each
        # other's negatives.
        row_ids=to_device(corpus.ids[triplets.positive[global_rows]], device),
        hard_negative_mask=gather_across_workers(present_t.float(), sizes) > 0.5,
    )
    return loss, loss * len(sizes)


def two_views(
    corpus: TokenizedCorpus, rows: np.ndarray, dup_rate: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(2n, width)`` ids and mask: the rows, then the rows again (with ESimCSE word
    repetition when ``dup_rate > 0``), padded to one width for a single forward pass."""
    input_ids, mask = corpus.batch(rows)
    if dup_rate <= 0:
        return np.concatenate([input_ids, input_ids]), np.concatenate([mask, mask])
    second_ids, second_mask = repeat_words(input_ids, mask, dup_rate, rng, corpus.pad_token_id)
    width = second_ids.shape[1]  # repetition only lengthens rows
    pad = width - input_ids.shape[1]
    input_ids = np.pad(input_ids, ((0, 0), (0, pad)), constant_values=corpus.pad_token_id)
    mask = np.pad(mask, ((0, 0), (0, pad)))
    return np.concatenate([input_ids, second_ids]), np.concatenate([mask, second_mask])


def epoch_end_metrics(state: TrainState, epoch_loss: float, outcome: EvalOutcome | None) -> dict[str, Any]:
    """What an epoch-end checkpoint reports to Ray Train (the job summary reads the last one)."""
    metrics: dict[str, Any] = {
        "epoch": state.epoch,
        "step": state.step,
        "epoch_loss": epoch_loss,
        "epoch_losses": list(state.epoch_losses),
        "plan_versions": list(state.plan_versions),
        "wait_seconds": list(state.wait_seconds),
        "refresh_seconds": list(state.refresh_seconds),
        "staleness_steps": list(state.staleness_steps),
        "plan_pending": state.plan_pending,
        "eval_history": list(state.eval_history),
    }
    if outcome is not None:
        metrics["eval_score"] = outcome.selection_score
    return metrics


@dataclass
class Boundary:
    """What happened at one epoch boundary."""

    wait_seconds: float = 0.0
    refresh_seconds: float = 0.0
    staleness_steps: int = 0
    late: bool = False
    """Async: a refresh was under way but not finished, so the current plan was kept."""


class PlanRefresher:
    """Gets each next epoch's plan from the miner (rank 0 talks to it) for every rank.

    ``sync``: at the epoch boundary rank 0 snapshots the weights and submits the refresh;
    the workers evaluate meanwhile (if ``eval.sts`` is set), then wait for the plan, which
    rank 0 broadcasts.
    ``async``: ``mining.max_staleness_steps`` steps before the boundary rank 0 snapshots the
    weights and submits the refresh, and training goes on while the miner works. At the
    boundary the newest finished plan is adopted without waiting; if the refresh has not
    finished, the current plan is kept (its batches reshuffled) and the refresh's plan is
    adopted at the next boundary, with its larger staleness logged.

    A miner that dies during a refresh is restarted by Ray (``mining.max_restarts``); the
    refresh is then submitted again with the newest weights, and the event is logged.
    """

    def __init__(
        self,
        cfg: Config,
        miner: Any,
        rank: int,
        lengths: np.ndarray,
        logger: Any = None,
        restarts: int = 0,
        miner_pid: int | None = None,
    ):
        self.cfg = cfg
        self.miner = miner if cfg.mining.enabled else None
        self.rank = rank
        self.lengths = lengths
        """Tokens per training row (:func:`pipeline.data.row_lengths`), one entry per row."""
        self.logger = logger
        self.pending: tuple[Any, int, float] | None = None  # (ref, snapshot step, submit time)
        self.submitted_in_epoch: int | None = None
        self.restarts = restarts
        """Miner deaths survived so far in this run (``mining.max_restarts`` bounds them)."""
        self.miner_pid = miner_pid
        """The miner's process id when last seen (its ``ready()``): a new one means Ray restarted it."""

    def _last_epoch(self, epoch: int) -> bool:
        return epoch + 1 >= self.cfg.train.epochs

    def asks_miner(self, epoch: int) -> bool:
        """Whether the boundary after epoch ``epoch`` gets its plan from the miner (and may wait)."""
        return self.miner is not None and not self._last_epoch(epoch)

    def _submit(self, model: SentenceEncoder, version: int, step: int) -> Any:
        import ray

        return self.miner.refresh.remote(ray.put(cpu_state_dict(model.encoder)), version, step)

    def after_step(
        self, epoch: int, steps_done: int, plan: BatchPlan, step: int, model: SentenceEncoder
    ) -> None:
        """Async only: submit the refresh once ``max_staleness_steps`` remain in the epoch
        (at once when a run resumes past that point: the lost refresh is not waited for).

        Its plan becomes version ``plan.version + 1``: no other plan can be adopted before it.
        """
        if (
            self.rank != 0
            or self.miner is None
            or self.cfg.mining.mode != "async"
            or self.pending is not None
            or self.submitted_in_epoch == epoch
            or self._last_epoch(epoch)
        ):
            return
        if steps_done >= max(0, plan.num_batches - self.cfg.mining.max_staleness_steps):
            self.pending = (self._submit(model, plan.version + 1, step), step, time.perf_counter())
            self.submitted_in_epoch = epoch

    def start_boundary_refresh(self, epoch: int, plan: BatchPlan, step: int, model: SentenceEncoder) -> None:
        """Sync: submit the epoch-end refresh as soon as the epoch's last step is done, so that
        what runs before :meth:`next_plan` (the evaluation) overlaps the miner's work. The
        weights are the same either way: nothing trains in between."""
        if self.rank != 0 or self.miner is None or self.cfg.mining.mode != "sync" or self._last_epoch(epoch):
            return
        self.pending = (self._submit(model, plan.version + 1, step), step, time.perf_counter())

    def next_plan(self, epoch: int, state: TrainState, model: SentenceEncoder) -> tuple[BatchPlan, Boundary]:
        import ray
        import torch.distributed as dist

        assert state.plan is not None
        current = state.plan
        if not self.asks_miner(epoch):
            # No refresh: a reshuffled plan, computed identically on every rank, no communication.
            return self._reshuffled(current, epoch), Boundary()
        start = time.perf_counter()
        payload: list[Any] = [None]
        if self.rank == 0:
            version = current.version + 1
            boundary = Boundary()
            report, snapshot_step = None, state.step
            if self.cfg.mining.mode == "sync":
                ref = (
                    self.pending[0] if self.pending is not None else self._submit(model, version, state.step)
                )
                self.pending = None
                deadline = time.monotonic() + self.cfg.mining.timeout_s
                while report is None:
                    try:
                        report = self._get(ref, version, deadline)
                    except ray.exceptions.RayActorError as exc:
                        deadline = self._recover(exc, version, state.step, deadline)
                        ref = self._submit(model, version, state.step)
            elif self.pending is not None:
                ref, snapshot_step, submitted = self.pending
                if ray.wait([ref], timeout=0)[0]:
                    try:
                        report = self._get(ref, version, time.monotonic() + self.cfg.mining.timeout_s)
                        self.pending = None
                    except ray.exceptions.RayActorError as exc:
                        # Async never waits for the plan: the new refresh's plan is adopted at
                        # the next boundary.
                        self._recover(exc, version, state.step, time.monotonic() + self.cfg.mining.timeout_s)
                        ref = self._submit(model, version, state.step)
                        self.pending = (ref, state.step, time.perf_counter())
                        boundary.late = True
                elif time.perf_counter() - submitted > self.cfg.mining.timeout_s:
                    raise UnrecoverableError(
                        f"the miner did not return a plan within mining.timeout_s={self.cfg.mining.timeout_s:g}s"
                    )
                else:
                    boundary.late = True
            if report is not None:
                plan = BatchPlan(version, report.plan.rows, report.plan.sizes)
                boundary.refresh_seconds = float(report.metrics["mining/total_s"])
                boundary.staleness_steps = state.step - snapshot_step
            else:
                plan = self._reshuffled(current, epoch)
            boundary.wait_seconds = time.perf_counter() - start
            payload[0] = (plan.to_dict(), boundary)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(payload, src=0)
        plan_dict, boundary = payload[0]
        boundary.wait_seconds = time.perf_counter() - start  # every rank's own wait
        return BatchPlan.from_dict(plan_dict), boundary

    def _timed_out(self, version: int) -> UnrecoverableError:
        return UnrecoverableError(
            f"the miner did not return plan v{version} within mining.timeout_s={self.cfg.mining.timeout_s:g}s"
        )

    def _get(self, ref: Any, version: int, deadline: float) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            raise self._timed_out(version) from None

    def _recover(self, exc: BaseException, version: int, step: int, deadline: float) -> float:
        """A refresh call failed on the actor (``exc``): wait until the miner answers again and
        return the deadline for the refresh that the caller submits again (from the newest
        weights).

        Ray reports both a miner that died and one that did not answer in time (frozen, or
        starved of CPU on a loaded machine) as actor errors; the miner's process id tells
        them apart. Only a new process, Ray's restart of a dead miner, counts against
        ``mining.max_restarts`` and gets a fresh ``mining.timeout_s``; an unresponsive one
        keeps the deadline the refresh already had.
        """
        import ray

        reason = first_line(exc)
        while True:
            # Calls made while Ray restarts the actor fail at once (max_task_retries=0): ask
            # again until it answers, it is dead for good, or the deadline passes.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timed_out(version)
            try:
                pid = ray.get(self.miner.ready.remote(), timeout=remaining)
                break
            except ray.exceptions.ActorUnavailableError:
                time.sleep(0.5)
            except ray.exceptions.GetTimeoutError:
                raise self._timed_out(version) from None
            except ray.exceptions.RayActorError as dead:
                # Ray restarts the actor mining.max_restarts times; after that it stays dead.
                raise UnrecoverableError(
                    f"the miner actor died during refresh v{version} and mining.max_restarts="
                    f"{self.cfg.mining.max_restarts} restarts are used up: {reason}"
                ) from dead
        if pid == self.miner_pid:
            print(
                f"[mining] the miner did not answer during refresh v{version} ({reason}); asking again",
                flush=True,
            )
            return deadline
        self.miner_pid = pid
        self.restarts += 1
        print(
            f"[mining] the miner actor died during refresh v{version} ({reason}); restart "
            f"{self.restarts}/{self.cfg.mining.max_restarts}, re-mining from the weights at step {step}",
            flush=True,
        )
        if self.logger is not None:
            self.logger.log({"mining/miner_restarts": float(self.restarts)}, step)
            self.logger.flush()
        return time.monotonic() + self.cfg.mining.timeout_s

    def _reshuffled(self, plan: BatchPlan, epoch: int) -> BatchPlan:
        """The same batches (or a fresh random plan for a random one) in a new order."""
        seed = self.cfg.run.seed + epoch + 1
        if plan.version == 0:
            return random_batches(self.cfg, seed, self.lengths)
        return plan.reordered(seed)


def random_batches(cfg: Config, seed: int, lengths: np.ndarray) -> BatchPlan:
    """A version-0 plan of random batches over the ``len(lengths)`` training rows, length-grouped
    when ``train.group_by_length``."""
    return random_plan(
        len(lengths),
        cfg.train.batch_size,
        seed=seed,
        version=0,
        lengths=lengths,
        group_batches=cfg.train.group_batches,
    )


def worker_failure_reporter(max_failures: int) -> Any:
    """A Ray Train callback that prints one line per failed worker-group attempt, and ends
    the run at once when the failure would only repeat.

    Ray Train's own report of a failure is a traceback (hidden by ``ray.train_log_level``);
    this line says which rank failed, why, and whether the group is restarted. Ray Train
    retries every worker error up to ``train.max_failures``; an error that
    :func:`pipeline.errors.is_deterministic` (a missing package, bad input, out of memory
    on a batch) would come back from the same checkpoint each time, so the callback raises
    Ray Train's ``ControllerError``, which its failure policy never retries. A dead worker
    is always retried. The callback runs in the Train controller, whose prints reach the
    driver's console."""
    from ray.train import ControllerError, UserCallback

    from pipeline.errors import describe_error, is_deterministic, is_process_death, root_cause

    class WorkerFailureReporter(UserCallback):
        def __init__(self) -> None:
            self.failures = 0

        def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
            self.failures += 1
            limit = "unlimited" if max_failures < 0 else str(max_failures)
            causes = {rank: root_cause(exc) for rank, exc in worker_exceptions.items()}
            a_worker_died = any(is_process_death(c) for c in causes.values())
            repeats = not a_worker_died and any(is_deterministic(c) for c in causes.values())
            retry = not repeats and (max_failures < 0 or self.failures <= max_failures)
            if repeats:
                decision = "not retried: it fails the same way on every restart)"
            elif retry:
                decision = "restarting the workers from the latest checkpoint)"
            else:
                decision = "giving up)"
            for rank, exc in sorted(worker_exceptions.items()):
                print(
                    f"[train] worker rank {rank} failed: {describe_error(exc)} (failure {self.failures}, "
                    f"train.max_failures={limit}; " + decision,
                    flush=True,
                )
            if repeats:
                first = next(rank for rank in sorted(causes) if is_deterministic(causes[rank]))
                raise ControllerError(causes[first])

    return WorkerFailureReporter()


def build_trainer(cfg: Config, loop_config: dict[str, Any], storage_path: str, run_name: str) -> Any:
    """A ``TorchTrainer`` over :func:`train_loop_per_worker` with resources, failure handling
    and checkpoint retention from config."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    # Read by Ray Train's controller (it propagates this variable): each start or restart of
    # the worker group waits this long for resources, and a timeout is not retried, so a
    # group that cannot be placed ends the job instead of waiting forever.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = f"{cfg.train.placement_timeout_s:g}"
    resources = {"CPU": cfg.train.cpus_per_worker}
    if cfg.train.use_gpu:
        resources["GPU"] = 1
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(
            backend="nccl" if cfg.train.use_gpu else "gloo",
            # Ranks other than 0 wait in a collective while rank 0 waits on the miner.
            timeout_s=int(cfg.mining.timeout_s) + 600,
        ),
        run_config=ray.train.RunConfig(
            name=run_name,
            storage_path=storage_path,
            failure_config=ray.train.FailureConfig(
                max_failures=cfg.train.max_failures, controller_failure_limit=0
            ),
            # The newest checkpoints, by report order; the best evaluated model is inside each.
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            callbacks=[worker_failure_reporter(cfg.train.max_failures)],
            logging_config=ray.train.LoggingConfig(log_level=cfg.ray.train_log_level),
        ),
    )
