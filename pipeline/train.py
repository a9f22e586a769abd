"""The per-worker SimCSE train loop and its Ray Train ``TorchTrainer``.

One ``fit()`` runs every epoch (each ``fit`` costs ~20 s of start-up). At each epoch end
rank 0 hands the newest encoder weights to the miner actor, broadcasts the returned plan to
the other ranks, and every rank reports a checkpoint holding the model, optimizer,
scheduler, step, RNG states and the next epoch's plan. A restarted run resumes from it.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.augment import repeat_words
from pipeline.config import Config, config_from_dict
from pipeline.data import TokenizedCorpus, Triplets
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
from pipeline.plans import BatchPlan, balanced_batch_sizes, random_plan, worker_slices
from pipeline.training_eval import EvalOutcome, TrainingEvaluator
from pipeline.whitening import Whitening, save_whitening

STATE_FILE = "train_state.pt"
MODEL_SUBDIR = "model"
PROGRESS_EVERY_S = 30.0


@dataclass
class TrainState:
    """What a checkpoint carries besides the model folder."""

    epoch: int = 0
    """Epochs completed."""
    step: int = 0
    plan: BatchPlan | None = None
    """Plan for the next epoch (``epoch + 1``)."""
    epoch_losses: list[float] = field(default_factory=list)
    plan_versions: list[int] = field(default_factory=list)
    """Version of the plan each completed epoch trained on."""
    wait_seconds: list[float] = field(default_factory=list)
    """Per epoch boundary: how long training waited for the next plan."""
    refresh_seconds: list[float] = field(default_factory=list)
    """Per epoch boundary: the miner's time for the plan adopted there (0 if none)."""
    staleness_steps: list[int] = field(default_factory=list)
    """Per epoch boundary: steps between the weights snapshot and the adopted plan's first use."""
    eval_history: list[dict[str, float]] = field(default_factory=list)
    """One entry per evaluation (``epoch``, ``step`` and the STS metrics); epoch 0 is the start model."""


def save_checkpoint(
    directory: Path,
    model: SentenceEncoder,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainState,
    max_seq_len: int,
    whitening: Whitening | None = None,
) -> None:
    save_model_dir(model, tokenizer, directory / MODEL_SUBDIR, max_seq_len)
    if whitening is not None:
        save_whitening(whitening, directory / MODEL_SUBDIR)
    assert state.plan is not None
    torch.save(
        {
            "epoch": state.epoch,
            "step": state.step,
            "plan_version": state.plan.version,
            "plan_rows": torch.tensor(state.plan.rows),
            "plan_sizes": torch.tensor(state.plan.sizes),
            "plan_negatives": torch.tensor(state.plan.negatives)
            if state.plan.negatives is not None
            else None,
            "epoch_losses": state.epoch_losses,
            "plan_versions": state.plan_versions,
            "wait_seconds": state.wait_seconds,
            "refresh_seconds": state.refresh_seconds,
            "staleness_steps": state.staleness_steps,
            "eval_history": state.eval_history,
            "mlp": model.mlp.state_dict() if model.mlp is not None else None,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
        directory / STATE_FILE,
    )


def load_train_state(directory: Path) -> dict[str, Any]:
    return torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)


def _seed_epoch(seed: int, rank: int, epoch: int) -> None:
    """Dropout randomness from (seed, rank, epoch): ranks differ, and a run resumed at an
    epoch boundary draws exactly what the uninterrupted run would have drawn."""
    torch.manual_seed(seed + 1_000_003 * rank + 7919 * epoch)
    random.seed(seed + rank + epoch)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: runs on every worker."""
    import ray
    import ray.train
    import ray.train.torch
    import torch.distributed as dist
    from transformers import get_linear_schedule_with_warmup

    quiet_libraries()
    cfg: Config = config_from_dict(loop_config["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()

    model_dir = unpack_dir(ray.get(loop_config["model_ref"]))
    tokenizer = load_tokenizer(model_dir)
    corpus = TokenizedCorpus(ray.get(loop_config["corpus_ref"]), tokenizer.pad_token_id)
    triplets = ray.get(loop_config["triplets_ref"]) if loop_config.get("triplets_ref") is not None else None
    num_rows = len(triplets) if triplets is not None else len(corpus)
    miner = loop_config["miner"]

    checkpoint = ray.train.get_checkpoint()
    saved: dict[str, Any] | None = None
    start_dir = model_dir
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            saved = load_train_state(Path(ckpt_dir))
            local_copy = Path(tempfile.mkdtemp(prefix="simcse-resume-"))
            shutil.copytree(Path(ckpt_dir) / MODEL_SUBDIR, local_copy, dirs_exist_ok=True)
            start_dir = local_copy

    # Same initial weights on every rank: they come from one folder (and the MLP head from
    # one seed), so DDP starts consistent without a broadcast.
    torch.manual_seed(cfg.run.seed)
    model = load_sentence_encoder(
        start_dir, pooler=cfg.model.pooler, use_mlp=cfg.use_mlp, dropout=cfg.model.dropout
    )
    model.to(device)

    total_steps = len(balanced_batch_sizes(num_rows, cfg.train.batch_size)) * cfg.train.epochs
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(param)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.train.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.train.lr,
        fused=fused,
    )
    scheduler = get_linear_schedule_with_warmup(
        optimizer, int(cfg.train.warmup_ratio * total_steps), total_steps
    )

    state = TrainState(plan=random_plan(num_rows, cfg.train.batch_size, seed=cfg.run.seed, version=0))
    if saved is not None:
        if model.mlp is not None and saved["mlp"] is not None:
            model.mlp.load_state_dict(saved["mlp"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = TrainState(
            epoch=saved["epoch"],
            step=saved["step"],
            plan=BatchPlan(
                saved["plan_version"],
                saved["plan_rows"].numpy(),
                saved["plan_sizes"].numpy(),
                saved["plan_negatives"].numpy() if saved["plan_negatives"] is not None else None,
            ),
            epoch_losses=list(saved["epoch_losses"]),
            plan_versions=list(saved["plan_versions"]),
            wait_seconds=list(saved["wait_seconds"]),
            refresh_seconds=list(saved["refresh_seconds"]),
            staleness_steps=list(saved["staleness_steps"]),
            eval_history=list(saved.get("eval_history", [])),
        )
        if rank == 0:
            print(
                f"[train] resumed after epoch {state.epoch} at step {state.step} (plan v{state.plan.version})",
                flush=True,
            )

    ddp_model = ray.train.torch.prepare_model(model, move_to_device=False)
    logger = None
    if rank == 0 and loop_config.get("run_id"):
        from pipeline.tracking import MetricLogger

        logger = MetricLogger(loop_config["tracking_uri"], loop_config["run_id"])

    refresher = PlanRefresher(cfg, miner, rank, num_rows)
    evaluator = None
    if loop_config.get("eval_ref") is not None:
        evaluator = TrainingEvaluator(
            cfg.eval, ray.get(loop_config["eval_ref"]), corpus, cfg.run.seed, rank, world, device
        )

    def run_eval(epoch: float) -> EvalOutcome | None:
        assert evaluator is not None
        started = time.perf_counter()
        outcome = evaluator.evaluate(model)
        if outcome is not None:
            metrics = outcome.metrics()
            state.eval_history.append({"epoch": float(epoch), "step": float(state.step), **metrics})
            if logger is not None:
                logger.log({**metrics, "eval_seconds": time.perf_counter() - started}, state.step)
                logger.flush()
            first = outcome.scores[0]
            whitened = (
                f" ({first.spearman_whitened:.2f} whitened)" if first.spearman_whitened is not None else ""
            )
            print(
                f"[eval] epoch {epoch:g} step {state.step}: {first.name} spearman {first.spearman:.2f}{whitened}, "
                f"alignment {first.alignment:.3f}, uniformity {first.uniformity:.3f} "
                f"({time.perf_counter() - started:.1f}s)",
                flush=True,
            )
        return outcome

    if evaluator is not None and state.step == 0:
        run_eval(0)  # the starting model: the "before" of every comparison
    use_bf16 = device.type == "cuda"
    for epoch in range(state.epoch, cfg.train.epochs):
        assert state.plan is not None
        plan = state.plan
        _seed_epoch(cfg.run.seed, rank, epoch)
        augment_rng = np.random.default_rng([cfg.run.seed, rank, epoch])
        model.train()
        epoch_start = time.perf_counter()
        loss_sum, loss_count = 0.0, 0
        last_progress = epoch_start
        refresher.after_step(epoch, 0, plan, state.step, model)
        for batch_index in range(plan.num_batches):
            step_start = time.perf_counter()
            global_rows = plan.batch(batch_index)
            sizes = worker_slices(len(global_rows), world)
            lo = sum(sizes[:rank])
            local_rows = global_rows[lo : lo + sizes[rank]]
            if triplets is None:
                input_ids, mask = two_views(corpus, local_rows, cfg.train.dup_rate, augment_rng)
                input_ids = torch.from_numpy(input_ids).to(device, non_blocking=True)
                mask = torch.from_numpy(mask).to(device, non_blocking=True)
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    # Both dropout views in one forward pass: the batch twice, stacked.
                    embeddings = ddp_model(input_ids, mask)
                view1, view2 = embeddings.float().split(len(local_rows))
                loss, loss_to_backward = global_batch_simcse_loss(
                    view1,
                    view2,
                    sizes,
                    torch.from_numpy(corpus.ids[global_rows]).to(device),
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
            refresher.after_step(epoch, batch_index + 1, plan, state.step, model)
            every = cfg.eval.every_steps
            if (
                evaluator is not None
                and every
                and state.step % every == 0
                and batch_index + 1 < plan.num_batches
            ):
                run_eval(epoch + (batch_index + 1) / plan.num_batches)  # restores train mode itself
            loss_value = float(loss.detach())
            loss_sum += loss_value
            loss_count += 1
            if logger is not None:
                elapsed = time.perf_counter() - step_start
                logger.log(
                    {
                        "train_loss": loss_value,
                        "learning_rate": scheduler.get_last_lr()[0],
                        "sentences_per_s": len(global_rows) / max(elapsed, 1e-9),
                    },
                    state.step,
                )
                if state.step % cfg.train.log_every == 0:
                    logger.flush()
            if rank == 0 and time.perf_counter() - last_progress > PROGRESS_EVERY_S:
                last_progress = time.perf_counter()
                rate = (batch_index + 1) * cfg.train.batch_size / (last_progress - epoch_start)
                print(
                    f"[train] epoch {epoch + 1}/{cfg.train.epochs} step {batch_index + 1}/{plan.num_batches}: "
                    f"loss {loss_sum / loss_count:.4f}, {rate:.0f} sentences/s",
                    flush=True,
                )

        epoch_loss = loss_sum / max(loss_count, 1)
        state.epoch_losses.append(epoch_loss)
        state.plan_versions.append(plan.version)
        epoch_seconds = time.perf_counter() - epoch_start
        refresher.start_boundary_refresh(epoch, plan, state.step, model)
        outcome = run_eval(epoch + 1) if evaluator is not None else None
        next_plan, boundary = refresher.next_plan(epoch, state, model)
        state.wait_seconds.append(boundary.wait_seconds)
        state.refresh_seconds.append(boundary.refresh_seconds)
        state.staleness_steps.append(boundary.staleness_steps)
        state.plan = next_plan
        state.epoch = epoch + 1
        if rank == 0:
            print(
                f"[train] epoch {epoch + 1}/{cfg.train.epochs}: loss {epoch_loss:.4f} over {loss_count} steps "
                f"on plan v{plan.version}, {epoch_seconds:.1f}s; next plan v{next_plan.version} "
                f"(waited {boundary.wait_seconds:.1f}s, staleness {boundary.staleness_steps} steps)",
                flush=True,
            )
        if logger is not None:
            logger.log(
                {
                    "epoch_loss": epoch_loss,
                    "epoch_plan_version": float(plan.version),
                    "epoch_seconds": epoch_seconds,
                    "epoch": float(epoch + 1),
                    "refresh_wait_s": boundary.wait_seconds,
                    "next_plan_version": float(next_plan.version),
                    "next_plan_staleness_steps": float(boundary.staleness_steps),
                    "refresh_late": float(boundary.late),
                },
                state.step,
            )
            logger.flush()
        metrics = {
            "epoch": state.epoch,
            "step": state.step,
            "epoch_loss": epoch_loss,
            "epoch_losses": list(state.epoch_losses),
            "plan_versions": list(state.plan_versions),
            "wait_seconds": list(state.wait_seconds),
            "refresh_seconds": list(state.refresh_seconds),
            "staleness_steps": list(state.staleness_steps),
            "next_plan_version": next_plan.version,
            "eval_history": list(state.eval_history),
        }
        if evaluator is not None:
            # Every rank reports the same score: Ray Train ranks checkpoints by it.
            metrics["eval_score"] = _broadcast_float(outcome.selection_score if outcome is not None else 0.0)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                save_checkpoint(
                    Path(tmp),
                    model,
                    tokenizer,
                    optimizer,
                    scheduler,
                    state,
                    cfg.data.max_seq_len,
                    whitening=outcome.whitening if outcome is not None else None,
                )
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _broadcast_float(value: float) -> float:
    """Rank 0's value on every rank (identity without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return float(holder[0])


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
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        embeddings = ddp_model(
            torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device)
        ).float()
    n = len(local_rows)
    present_t = torch.from_numpy(present).to(device)
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
        row_ids=torch.from_numpy(corpus.ids[triplets.positive[global_rows]]).to(device),
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
    """

    def __init__(self, cfg: Config, miner: Any, rank: int, num_rows: int):
        self.cfg = cfg
        self.miner = miner if cfg.mining.enabled else None
        self.rank = rank
        self.num_rows = num_rows
        self.pending: tuple[Any, int, float] | None = None  # (ref, snapshot step, submit time)

    def _last_epoch(self, epoch: int) -> bool:
        return epoch + 1 >= self.cfg.train.epochs

    def _submit(self, model: SentenceEncoder, version: int, step: int) -> Any:
        import ray

        return self.miner.refresh.remote(ray.put(cpu_state_dict(model.encoder)), version, step)

    def after_step(
        self, epoch: int, steps_done: int, plan: BatchPlan, step: int, model: SentenceEncoder
    ) -> None:
        """Async only: submit the refresh once ``max_staleness_steps`` remain in the epoch.

        Its plan becomes version ``plan.version + 1``: no other plan can be adopted before it.
        """
        if (
            self.rank != 0
            or self.miner is None
            or self.cfg.mining.mode != "async"
            or self.pending is not None
        ):
            return
        if self._last_epoch(epoch):
            return
        if steps_done == max(0, plan.num_batches - self.cfg.mining.max_staleness_steps):
            self.pending = (self._submit(model, plan.version + 1, step), step, time.perf_counter())

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
        if self._last_epoch(epoch) or self.miner is None:
            # No refresh: a reshuffled plan, computed identically on every rank, no communication.
            return self._reshuffled(current, epoch), Boundary()
        start = time.perf_counter()
        payload: list[Any] = [None]
        if self.rank == 0:
            boundary = Boundary()
            report, snapshot_step = None, state.step
            if self.cfg.mining.mode == "sync":
                ref = (
                    self.pending[0]
                    if self.pending is not None
                    else self._submit(model, current.version + 1, state.step)
                )
                self.pending = None
                report = self._get(ref, current.version + 1)
            elif self.pending is not None:
                ref, snapshot_step, submitted = self.pending
                if ray.wait([ref], timeout=0)[0]:
                    report = self._get(ref, current.version + 1)
                    self.pending = None
                elif time.perf_counter() - submitted > self.cfg.mining.timeout_s:
                    raise TimeoutError(
                        f"the miner did not return a plan within mining.timeout_s={self.cfg.mining.timeout_s:g}s"
                    )
                else:
                    boundary.late = True
            if report is not None:
                plan = BatchPlan(current.version + 1, report.plan.rows, report.plan.sizes)
                boundary.refresh_seconds = float(report.metrics["mining_total_s"])
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

    def _get(self, ref: Any, version: int) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=self.cfg.mining.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"the miner did not return plan v{version} within mining.timeout_s={self.cfg.mining.timeout_s:g}s"
            ) from None

    def _reshuffled(self, plan: BatchPlan, epoch: int) -> BatchPlan:
        """The same batches (or a fresh random plan for a random one) in a new order."""
        seed = self.cfg.run.seed + epoch + 1
        if plan.version == 0:
            return random_plan(self.num_rows, self.cfg.train.batch_size, seed=seed, version=0)
        return plan.reordered(seed)


def build_trainer(cfg: Config, loop_config: dict[str, Any], storage_path: str, run_name: str) -> Any:
    """A ``TorchTrainer`` over :func:`train_loop_per_worker` with resources from config."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

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
            # With evaluation, the best checkpoints by the first STS file's score are kept (and the
            # latest, which Ray Train always keeps for resuming).
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=2,
                checkpoint_score_attribute="eval_score" if cfg.eval.sts else None,
                checkpoint_score_order="max",
            ),
        ),
    )
