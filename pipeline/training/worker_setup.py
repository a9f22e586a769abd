"""What a training worker builds before its first step: its inputs from the object store,
the model, optimizer and schedule, the resumed state, and rank 0's metric logger.

:func:`worker_parts` is :meth:`pipeline.training.worker.SimCSEWorker.setup`; each piece runs in the order
the worker needs it (the model is seeded before it is built, the resumed state is read
before the model is).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train.torch
import torch
from transformers import get_linear_schedule_with_warmup

from pipeline.batching.plan import balanced_batch_sizes
from pipeline.config.schema import Config
from pipeline.data.tokenized import CorpusShare
from pipeline.data.triplets import Triplets
from pipeline.evaluation.in_training import TrainingEvaluator
from pipeline.model.accel import enable_tf32, fused_adamw, native_bf16
from pipeline.model.encoder import SentenceEncoder, folder_pooler, load_sentence_encoder
from pipeline.model.flops import device_peak_tflops
from pipeline.model.folders import load_tokenizer, quiet_libraries, unpacked_dir
from pipeline.tracking.metric_logger import MetricLogger
from pipeline.tracking.system import system_metrics
from pipeline.training.contract import LoopConfig, miner_inputs
from pipeline.training.masking import MaskingSpec
from pipeline.training.miner_client import MinerClient
from pipeline.training.plan_source import PlanInputs, PlanSource, share_of
from pipeline.training.refresh import PlanRefresher
from pipeline.training.refresh_policy import RefreshSettings
from pipeline.training.resume import ResumePoint, find_resume_point
from pipeline.training.state import TrainState
from pipeline.training.step import TrainStep, make_train_step
from pipeline.training.worker_reports import CheckpointReporter, EvalRecorder


@dataclass
class WorkerInputs:
    """The run's data and tokenizer, fetched from the object store."""

    tokenizer: Any
    corpus: CorpusShare
    """The rows this worker trains on, fetched epoch by epoch (empty until the first)."""
    triplets: Triplets | None
    """The pairs task's rows; None in unsupervised mode."""
    num_rows: int
    """Training rows of an epoch: triplet rows, or corpus sentences."""


def fetch_inputs(loop_config: LoopConfig, model_dir: Path) -> WorkerInputs:
    """The tokenizer (from ``model_dir``, the starting model the driver put in the object
    store, unpacked) and the triplets the driver put there; the corpus' rows are fetched epoch
    by epoch, this worker's only (:class:`~pipeline.data.tokenized.CorpusShare`)."""
    tokenizer = load_tokenizer(model_dir)
    triplets = ray.get(loop_config.triplets_ref) if loop_config.triplets_ref is not None else None
    corpus = CorpusShare(loop_config.corpus, tokenizer.pad_token_id, len(tokenizer))
    return WorkerInputs(
        tokenizer=tokenizer,
        corpus=corpus,
        triplets=triplets,
        num_rows=len(triplets) if triplets is not None else corpus.num_texts,
    )


def plan_inputs(loop_config: LoopConfig) -> PlanInputs:
    """What this run's plans are made from (:mod:`pipeline.training.plan_source`)."""
    return PlanInputs(loop_config.config, loop_config.corpus.lengths_ref, loop_config.triplets_ref)


def build_model(cfg: Config, model_dir: Path, device: torch.device) -> SentenceEncoder:
    """The encoder from ``model_dir`` on ``device``, compiled in place unless ``train.compile`` is ``off``."""
    # Same initial weights on every rank: they come from one folder (and the MLP head from
    # one seed), so DDP starts consistent without a broadcast.
    torch.manual_seed(cfg.run.seed)
    pooler = cfg.model.pooler or folder_pooler(model_dir)
    use_mlp = pooler == "cls" if cfg.model.mlp is None else cfg.model.mlp  # SimCSE: a head with cls
    model = load_sentence_encoder(
        model_dir, pooler=pooler, use_mlp=use_mlp, dropout=cfg.model.dropout, use_mlm=cfg.train.mlm_weight > 0
    )
    model.mini_batch_size = cfg.train.mini_batch_size
    model.to(device)
    enable_tf32(device)
    if cfg.train.compile != "off":
        # In place: the state_dict keys (checkpoints, export) and DDP wrapping stay as they are.
        model.compile(mode=cfg.train.compile)
    return model


def build_optimizer(cfg: Config, model: SentenceEncoder, num_rows: int) -> tuple[torch.optim.Optimizer, Any]:
    """Fused AdamW and its linear warm-up/decay schedule over every step of the run."""
    total_steps = len(balanced_batch_sizes(num_rows, cfg.train.batch_size)) * cfg.train.epochs
    optimizer = fused_adamw(model, cfg.train.lr, cfg.train.weight_decay)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(cfg.train.warmup_ratio * total_steps), total_steps
    )
    return optimizer, scheduler


def initial_state(
    cfg: Config,
    plans: PlanInputs,
    resume: ResumePoint | None,
    *,
    model: SentenceEncoder,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int,
    world: int,
) -> TrainState:
    """The state to start from.

    A fresh run starts at step 0 on a random plan (``run.seed``). A resumed one takes the
    checkpoint's state, MLP head, optimizer and schedule (its encoder weights were loaded from
    the checkpoint by :func:`build_model`); either way the rank's share of the plan is made
    from where the plan comes from. Rank 0 prints where it resumes.
    """
    if resume is None:
        source = PlanSource(version=0, seed=cfg.run.seed)
        return TrainState(source=source, plan=share_of(source, plans, world=world, rank=rank))
    state = resume.state
    assert state.source is not None
    state.plan = share_of(state.source, plans, world=world, rank=rank)
    if model.mlp is not None and resume.extras["mlp"] is not None:
        model.mlp.load_state_dict(resume.extras["mlp"])
    if model.mlm_head is not None and resume.extras["mlm_head"] is not None:
        model.mlm_head.load_own_state_dict(resume.extras["mlm_head"])
    optimizer.load_state_dict(resume.extras["optimizer"])
    scheduler.load_state_dict(resume.extras["scheduler"])
    if rank == 0:
        where = (
            f"in epoch {state.epoch + 1} after batch {state.batches_done}/{state.plan.num_batches}"
            if state.batches_done
            else f"after epoch {state.epoch}"
        )
        print(
            f"[train] resumed at step {state.step}, {where} "
            f"(plan v{state.plan.version}, fingerprint {state.plan.fingerprint})",
            flush=True,
        )
    return state


def open_logger(loop_config: LoopConfig, rank: int, state: TrainState, resumed: bool) -> Any:
    """Rank 0's :class:`~pipeline.tracking.metric_logger.MetricLogger` (None on other ranks or
    without a run); a run resumed past step 0 logs the step it resumed at."""
    if rank != 0 or not loop_config.run_id:
        return None

    logger = MetricLogger(loop_config.tracking_uri, loop_config.run_id, relay=loop_config.tracking_relay)
    if resumed and state.step > 0:
        logger.log({"train/resumed_at_step": float(state.step)}, state.step)
    return logger


def build_evaluator(
    loop_config: LoopConfig, rank: int, world: int, device: torch.device
) -> TrainingEvaluator | None:
    """The in-training evaluator, or None when the run has neither an STS nor a retrieval set."""
    if loop_config.eval_ref is None and loop_config.retrieval_ref is None:
        return None

    sts = ray.get(loop_config.eval_ref) if loop_config.eval_ref is not None else None
    retrieval = ray.get(loop_config.retrieval_ref) if loop_config.retrieval_ref is not None else None
    return TrainingEvaluator(
        loop_config.config.eval, sts, rank=rank, world=world, device=device, retrieval_set=retrieval
    )


def system_metrics_monitor(loop_config: LoopConfig, ctx: Any) -> contextlib.AbstractContextManager[Any]:
    """The node's system-metrics monitor (``tracking.system_metrics``) on the first worker of
    each node the driver does not run on (the driver samples its own for the whole job), as
    ``system/node_<rank>/...``; a no-op elsewhere and in runs without tracking."""
    cfg = loop_config.config
    if not (cfg.tracking.system_metrics and loop_config.run_id and ctx.get_local_rank() == 0):
        return contextlib.nullcontext()
    if ray.get_runtime_context().get_node_id() == loop_config.driver_node_id:
        return contextlib.nullcontext()

    return system_metrics(
        loop_config.tracking_uri,
        loop_config.run_id,
        node_id=f"node_{ctx.get_node_rank()}",
        relay=loop_config.tracking_relay,
    )


@dataclass(frozen=True)
class WorkerParts:
    """What one rank trains with: :class:`~pipeline.training.worker.SimCSEWorker` is built
    from one of these (:func:`worker_parts`)."""

    cfg: Config
    rank: int
    world: int
    model: SentenceEncoder
    ddp_model: Any
    """``model`` wrapped for DDP (``model`` itself with one worker)."""
    train_step: TrainStep
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainState
    share: CorpusShare
    """The rows this rank trains on, held epoch by epoch (what ``train_step`` reads)."""
    device: torch.device
    """Where the step runs (and the global batch's rows are gathered)."""
    refresher: PlanRefresher | None
    evaluator: EvalRecorder | None
    checkpoints: CheckpointReporter | None
    logger: Any
    """Rank 0's metric logger; None on the other ranks and in runs without tracking."""
    peak_tflops: float | None = None
    """The device's peak for ``train/mfu`` (None: no MFU logged)."""


def last_miner_pid(seen: list[str | int] | None, at_start: int | None) -> int | None:
    """The miner's process id rank 0 last heard from in this job (``seen``, from the checkpoint
    a restarted worker group resumes), else the one the driver saw at the start (``at_start``):
    a checkpoint of an earlier job names that job's miner."""
    if seen and seen[0] == ray.get_runtime_context().get_job_id():
        return int(seen[1])
    return at_start


def worker_parts(loop_config: LoopConfig, ctx: Any, *, scratch: Path) -> WorkerParts:
    """What :class:`~pipeline.training.worker.SimCSEWorker` trains with on this rank, from the
    driver's inputs and the Ray Train context; from the latest complete checkpoint when the run
    resumes. Its local files (the resumed checkpoint's copy, the best evaluated model) live in
    ``scratch``, the worker's own folder, which goes with the worker."""
    cfg = loop_config.config
    quiet_libraries()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    resume = find_resume_point(scratch / "resume")
    with unpacked_dir(ray.get(loop_config.model_ref)) as start_dir:
        inputs = fetch_inputs(loop_config, start_dir)
        model = build_model(cfg, resume.model_dir if resume is not None else start_dir, device)
    # Rank 0's copy of the best evaluated model: the checkpoint's, or empty until the first.
    best_dir = resume.best_dir if resume is not None and resume.best_dir is not None else scratch / "best"
    optimizer, scheduler = build_optimizer(cfg, model, inputs.num_rows)
    plans = plan_inputs(loop_config)
    state = initial_state(
        cfg, plans, resume, model=model, optimizer=optimizer, scheduler=scheduler, rank=rank, world=world
    )
    ddp_model = ray.train.torch.prepare_model(model, move_to_device=False)
    logger = open_logger(loop_config, rank, state, resumed=resume is not None)
    bf16 = native_bf16(device)  # the hardware decides, on a CPU as on a GPU: not a config key
    if rank == 0:
        logger.set_tags({"simcse.forward_dtype": "bf16" if bf16 else "fp32"})
    client = None
    if loop_config.miner is not None and cfg.mines:
        client = MinerClient(
            loop_config.miner,
            RefreshSettings.from_config(cfg),
            logger=logger,
            restarts=state.history.miner_restarts,
            miner_pid=last_miner_pid(state.history.miner_seen, loop_config.miner_pid),
            inputs=miner_inputs(
                loop_config.corpus,
                loop_config.model_ref,
                loop_config.triplets_ref,
                loop_config.texts,
                loop_config.teacher_ref,
            ),
        )
    refresher = PlanRefresher(cfg, rank, world, plans, client)
    sts = build_evaluator(loop_config, rank, world, device)
    max_seq_len = cfg.data.max_seq_len
    return WorkerParts(
        cfg=cfg,
        rank=rank,
        world=world,
        model=model,
        ddp_model=ddp_model,
        train_step=make_train_step(
            cfg,
            inputs.corpus,
            inputs.triplets,
            device,
            bf16=bf16,
            masking=MaskingSpec.of_tokenizer(inputs.tokenizer) if cfg.train.mlm_weight > 0 else None,
        ),  # fmt: skip
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        share=inputs.corpus,
        device=device,
        refresher=refresher,
        evaluator=EvalRecorder(
            sts, model, inputs.tokenizer, best_dir=best_dir, max_seq_len=max_seq_len, logger=logger
        )
        if sts is not None
        else None,
        checkpoints=CheckpointReporter(
            model,
            inputs.tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            best_dir=best_dir,
            max_seq_len=max_seq_len,
            rank=rank,
            world=world,
            logger=logger,
        ),  # fmt: skip
        logger=logger,
        peak_tflops=device_peak_tflops(device),
    )
