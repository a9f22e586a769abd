"""What a training checkpoint holds, and how it is written, verified and read back.

A checkpoint folder::

    model/            the encoder as a Hugging Face + sentence-transformers folder
    best_model/       the best evaluated model so far, when it is not ``model/`` itself
    train_state.pt    step, position in the epoch, the plan's source, optimizer, scheduler, every
                      rank's RNG states, histories (read with ``weights_only=True``)
    manifest.json     written last: every file's size

Ray Train only registers a checkpoint once the worker's upload returned, so a worker that
dies mid-upload leaves an unregistered folder that is never resumed from. The manifest
covers the rest (a storage that truncated a file, a folder copied by hand): a checkpoint
whose files do not match it is skipped in favour of the newest one that does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from pipeline.model.folders import save_model_dir
from pipeline.training.state import BestModel, TrainState

STATE_FILE = "train_state.pt"
MANIFEST_FILE = "manifest.json"
MODEL_SUBDIR = "model"
BEST_SUBDIR = "best_model"


def save_checkpoint(
    directory: Path,
    model: Any,
    tokenizer: Any,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainState,
    max_seq_len: int,
    best_dir: Path | None = None,
) -> None:
    """Write a complete checkpoint into ``directory`` (manifest last).

    ``best_dir`` is the local copy of the best evaluated model; it is included unless the
    best evaluation is this very step (then ``model/`` is the best model).
    """

    save_model_dir(model, tokenizer, directory / MODEL_SUBDIR, max_seq_len)
    if state.history.best is not None and state.history.best.step != state.step:
        assert best_dir is not None and best_dir.is_dir(), "best model snapshot missing"
        shutil.copytree(best_dir, directory / BEST_SUBDIR)
    torch.save(
        {
            "state": state.to_dict(),
            "mlp": model.mlp.state_dict() if model.mlp is not None else None,
            "mlm_head": model.mlm_head.own_state_dict() if model.mlm_head is not None else None,
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
    """``(state, {"mlp", "mlm_head", "optimizer", "scheduler"})`` from a verified checkpoint
    folder (``mlm_head`` None in one written before the MLM objective existed)."""
    saved = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    state = TrainState.from_dict(saved["state"])
    return state, {k: saved.get(k) for k in ("mlp", "mlm_head", "optimizer", "scheduler")}


def best_model_folder(directory: Path) -> tuple[Path, BestModel | None]:
    """The folder to export from a checkpoint: the best evaluated model (``best_model/``, or
    ``model/`` when the checkpoint's own step was the best), and which evaluation that was."""
    saved = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
    best = TrainState.from_dict(saved["state"]).history.best
    if best is not None and (directory / BEST_SUBDIR).is_dir():
        return directory / BEST_SUBDIR, best
    return directory / MODEL_SUBDIR, best


def export_checkpoint_model(checkpoint: Any, export_dir: Path) -> tuple[Path, BestModel | None]:
    """Copy the model to ship out of the run's final checkpoint into ``export_dir`` (replacing
    an earlier export): the best evaluated model it carries, else its current model.

    Returns the folder and the evaluation that chose it (None without evaluation).
    """
    if export_dir.exists():
        shutil.rmtree(export_dir)
    with checkpoint.as_directory() as ckpt_dir:
        folder, best = best_model_folder(Path(ckpt_dir))
        shutil.copytree(folder, export_dir)
    return export_dir, best
