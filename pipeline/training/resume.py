"""Finding the checkpoint a restarted worker group resumes from."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train

from pipeline.training.checkpoint import BEST_SUBDIR, MODEL_SUBDIR, checkpoint_problem, load_checkpoint
from pipeline.training.state import TrainState


@dataclass
class ResumePoint:
    """A verified checkpoint, read into memory and local folders."""

    state: TrainState
    extras: dict[str, Any]
    """``mlp``, ``mlm_head``, ``optimizer`` and ``scheduler`` state dicts."""
    model_dir: Path
    best_dir: Path | None
    """Local copy of the best evaluated model, when the checkpoint names one."""


def find_resume_point(local: Path) -> ResumePoint | None:
    """The newest reported checkpoint whose files are complete, its model folders copied under
    ``local`` (a folder of the worker's own, created here).

    Ray Train hands the latest registered checkpoint; should its files not match their
    manifest, older reported checkpoints are tried newest first (each skip is printed).
    """
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
                shutil.copytree(folder / MODEL_SUBDIR, local / MODEL_SUBDIR)
                best_dir = None
                if state.history.best is not None:
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
