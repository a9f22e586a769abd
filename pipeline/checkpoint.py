"""What a training checkpoint holds, and how it is written, verified and read back.

A checkpoint folder::

    model/            the encoder as a Hugging Face + sentence-transformers folder
    best_model/       the best evaluated model so far, when it is not ``model/`` itself
    train_state.pt    step, position in the epoch, plan, optimizer, scheduler, every
                      rank's RNG states, histories (read with ``weights_only=True``)
    manifest.json     written last: every file's size

Ray Train only registers a checkpoint once the worker's upload returned, so a worker that
dies mid-upload leaves an unregistered folder that is never resumed from. The manifest
covers the rest (a storage that truncated a file, a folder copied by hand): a checkpoint
whose files do not match it is skipped in favour of the newest one that does.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.plans import BatchPlan

STATE_FILE = "train_state.pt"
MANIFEST_FILE = "manifest.json"
MODEL_SUBDIR = "model"
BEST_SUBDIR = "best_model"


@dataclass
class BestModel:
    """The evaluation that scored highest so far."""

    score: float
    epoch: float
    """Fractional for an evaluation inside an epoch (``eval.every_steps``)."""
    step: int


@dataclass
class TrainState:
    """Where training is, and what it has done so far: everything besides the weights,
    optimizer and scheduler that a resumed run needs to continue exactly."""

    epoch: int = 0
    """Epochs completed."""
    batches_done: int = 0
    """Batches of the epoch in progress (``epoch + 1``) already trained; 0 at a boundary."""
    step: int = 0
    plan: BatchPlan | None = None
    """The plan of the epoch in progress, or of the next one at a boundary (the finished
    epoch's own plan while ``plan_pending``)."""
    plan_pending: bool = False
    """At a boundary: checkpointed before the miner's plan for the next epoch came back, so a
    run resumed here asks the miner again."""
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
    best: BestModel | None = None
    miner_restarts: int = 0
    """Times the miner actor died during a refresh and was restarted."""
    loss_sum: float = 0.0
    """Sum of the epoch in progress' step losses so far (its mean is the epoch loss)."""
    epoch_seconds: float = 0.0
    """Training time of the epoch in progress so far (across restarts)."""
    unsent_metrics: list[tuple[str, float, int, int]] = field(default_factory=list)
    """Rank 0's metrics MLflow had not taken yet (``(key, value, timestamp ms, step)``); the
    run that resumes from the checkpoint sends them."""
    rng: list[dict[str, Any]] | None = None
    """Per rank: torch (and CUDA), Python and word-repetition generator states, captured at
    the checkpoint. None at an epoch boundary, where each epoch reseeds from (seed, rank, epoch)."""


def capture_rng(augment_rng: np.random.Generator) -> dict[str, Any]:
    """This process' random states: dropout (torch), Python's, and the augmentation generator."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "augment": augment_rng.bit_generator.state,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any], augment_rng: np.random.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    augment_rng.bit_generator.state = state["augment"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    directory: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainState,
    max_seq_len: int,
    whitening: Any = None,
    best_dir: Path | None = None,
) -> None:
    """Write a complete checkpoint into ``directory`` (manifest last).

    ``best_dir`` is the local copy of the best evaluated model; it is included unless the
    best evaluation is this very step (then ``model/`` is the best model).
    """
    from pipeline.model import save_model_dir
    from pipeline.whitening import save_whitening

    save_model_dir(model, tokenizer, directory / MODEL_SUBDIR, max_seq_len)
    if whitening is not None:
        save_whitening(whitening, directory / MODEL_SUBDIR)
    if state.best is not None and state.best.step != state.step:
        assert best_dir is not None and best_dir.is_dir(), "best model snapshot missing"
        shutil.copytree(best_dir, directory / BEST_SUBDIR)
    assert state.plan is not None
    torch.save(
        {
            "epoch": state.epoch,
            "batches_done": state.batches_done,
            "step": state.step,
            "plan": _plan_tensors(state.plan),
            "plan_pending": state.plan_pending,
            "epoch_losses": state.epoch_losses,
            "plan_versions": state.plan_versions,
            "wait_seconds": state.wait_seconds,
            "refresh_seconds": state.refresh_seconds,
            "staleness_steps": state.staleness_steps,
            "eval_history": state.eval_history,
            "best": None if state.best is None else vars(state.best),
            "loss_sum": state.loss_sum,
            "miner_restarts": state.miner_restarts,
            "epoch_seconds": state.epoch_seconds,
            "rng": state.rng,
            "unsent_metrics": state.unsent_metrics,
            "mlp": model.mlp.state_dict() if model.mlp is not None else None,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
        directory / STATE_FILE,
    )
    files = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    (directory / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))


def checkpoint_problem(directory: Path) -> str | None:
    """Why the checkpoint folder cannot be trusted, or None when every file is complete."""
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return f"no {MANIFEST_FILE} (the write did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"unreadable {MANIFEST_FILE}: {exc}"
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {size}"
    return None


def load_checkpoint(directory: Path) -> tuple[TrainState, dict[str, Any]]:
    """``(state, {"mlp", "optimizer", "scheduler"})`` from a verified checkpoint folder."""
    saved = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    state = TrainState(
        epoch=saved["epoch"],
        batches_done=saved["batches_done"],
        step=saved["step"],
        plan=_plan_from_tensors(saved["plan"]),
        plan_pending=bool(saved.get("plan_pending", False)),
        epoch_losses=list(saved["epoch_losses"]),
        plan_versions=list(saved["plan_versions"]),
        wait_seconds=list(saved["wait_seconds"]),
        refresh_seconds=list(saved["refresh_seconds"]),
        staleness_steps=list(saved["staleness_steps"]),
        eval_history=list(saved["eval_history"]),
        best=BestModel(**saved["best"]) if saved["best"] is not None else None,
        loss_sum=saved["loss_sum"],
        miner_restarts=saved["miner_restarts"],
        epoch_seconds=saved["epoch_seconds"],
        rng=saved["rng"],
        unsent_metrics=[tuple(m) for m in saved["unsent_metrics"]],
    )
    return state, {k: saved[k] for k in ("mlp", "optimizer", "scheduler")}


def best_model_folder(directory: Path) -> tuple[Path, BestModel | None]:
    """The folder to export from a checkpoint: the best evaluated model (``best_model/``, or
    ``model/`` when the checkpoint's own step was the best), and which evaluation that was."""
    saved = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    best = BestModel(**saved["best"]) if saved["best"] is not None else None
    if best is not None and (directory / BEST_SUBDIR).is_dir():
        return directory / BEST_SUBDIR, best
    return directory / MODEL_SUBDIR, best


def _plan_tensors(plan: BatchPlan) -> dict[str, Any]:
    def tensor(values: np.ndarray) -> torch.Tensor:
        # A copy: a plan that came through Ray's object store is a read-only view.
        return torch.tensor(np.asarray(values, dtype=np.int64))

    return {
        "version": plan.version,
        "rows": tensor(plan.rows),
        "sizes": tensor(plan.sizes),
        "negatives": tensor(plan.negatives) if plan.negatives is not None else None,
    }


def _plan_from_tensors(saved: dict[str, Any]) -> BatchPlan:
    negatives = saved["negatives"]
    return BatchPlan(
        saved["version"],
        saved["rows"].numpy(),
        saved["sizes"].numpy(),
        negatives.numpy() if negatives is not None else None,
    )
