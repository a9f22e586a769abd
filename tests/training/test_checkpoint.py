"""Checkpoint contents, verification and random-state capture, and which folder Ray Train resumes, without Ray."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.batching.samplers import random_plan
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer
from pipeline.training.checkpoint import (
    BEST_SUBDIR,
    MANIFEST_FILE,
    STATE_FILE,
    best_model_folder,
    checkpoint_problem,
    load_checkpoint,
    save_checkpoint,
)
from pipeline.training.plan_source import PlanSource
from pipeline.training.state import BestModel, TrainHistory, TrainState, capture_rng, restore_rng
from pipeline.training.trainer import RESUME_SNAPSHOT, resumable_checkpoints


def _saved(tmp_path, tiny_model_dir, best_step=None, name="ckpt"):
    model = load_sentence_encoder(tiny_model_dir, pooler="cls", use_mlp=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    source = PlanSource(
        3, mined_plan="file:///storage/run/mined/v3-plan.npz", reorders=(5, 6), negatives=None
    )
    state = TrainState(
        epoch=1, batches_done=2, step=7, source=source, plan=random_plan(40, 8, seed=1).share(world=1, rank=0), loss_sum=2.5,
        history=TrainHistory(epoch_losses=[1.5], evaluations=[{"epoch": 0.0, "step": 0.0}], miner_restarts=1), rng=[capture_rng(np.random.default_rng(0))], unsent_metrics=[("train_loss", 0.5, 123, 7)],
    )  # fmt: skip
    best_dir = None
    if best_step is not None:
        state.history.best = BestModel(score=80.0, epoch=0.5, step=best_step)
        best_dir = tmp_path / "best"
        from pipeline.model.folders import save_model_dir

        save_model_dir(model, load_tokenizer(tiny_model_dir), best_dir, 32)
    directory = tmp_path / name
    directory.mkdir()
    save_checkpoint(
        directory,
        model,
        load_tokenizer(tiny_model_dir),
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        max_seq_len=32,
        best_dir=best_dir,
    )
    return directory, state, model, optimizer


def test_checkpoint_round_trip_and_best_model(tmp_path, tiny_model_dir):
    directory, state, model, optimizer = _saved(tmp_path, tiny_model_dir, best_step=4)
    assert checkpoint_problem(directory) is None
    loaded, extras = load_checkpoint(directory)
    assert (loaded.epoch, loaded.batches_done, loaded.step, loaded.loss_sum) == (1, 2, 7, 2.5)
    # Where the plan comes from, not its arrays: every rank makes its share again from it.
    assert loaded.source == state.source and loaded.plan is None
    assert loaded.history == state.history and loaded.history.best == BestModel(80.0, 0.5, 4)
    assert loaded.unsent_metrics == [("train_loss", 0.5, 123, 7)]
    for key, value in model.mlp.state_dict().items():
        assert torch.equal(extras["mlp"][key], value)
    restored = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restored.load_state_dict(extras["optimizer"])
    assert restored.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    # The best evaluation (step 4) is older than the checkpoint (step 7): its folder travels along.
    folder, best = best_model_folder(directory)
    assert folder == directory / BEST_SUBDIR and best.step == 4
    assert (folder / "model.safetensors").exists()


def test_best_model_at_the_checkpoint_step_is_not_copied(tmp_path, tiny_model_dir):
    directory, *_ = _saved(tmp_path, tiny_model_dir, best_step=7)
    assert not (directory / BEST_SUBDIR).exists()
    folder, best = best_model_folder(directory)
    assert folder.name == "model" and best.step == 7


@pytest.mark.parametrize("damage", ["truncate", "delete", "no_manifest"])
def test_damaged_checkpoint_is_detected(tmp_path, tiny_model_dir, damage):
    directory, *_ = _saved(tmp_path, tiny_model_dir)
    if damage == "truncate":
        data = (directory / STATE_FILE).read_bytes()
        (directory / STATE_FILE).write_bytes(data[: len(data) // 2])
        expected = f"{STATE_FILE} has {len(data) // 2} bytes, the manifest says {len(data)}"
    elif damage == "delete":
        (directory / "model" / "model.safetensors").unlink()
        expected = "model/model.safetensors is missing"
    else:
        (directory / MANIFEST_FILE).unlink()
        expected = f"no {MANIFEST_FILE}"
    assert expected in checkpoint_problem(directory)


def test_restored_random_state_repeats_the_same_draws():
    augment = np.random.default_rng(5)
    torch.manual_seed(3)
    torch.rand(4)
    augment.random(3)
    saved = capture_rng(augment)
    first = (torch.rand(5), np.random.default_rng(0).random(1), augment.random(4))
    other = np.random.default_rng(99)
    torch.manual_seed(123)
    restore_rng(saved, other)
    assert torch.equal(torch.rand(5), first[0])
    assert np.array_equal(other.random(4), first[2])


def test_metric_logger_sends_in_background_and_requeues(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.metric_logger import MetricLogger

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("logger")).info.run_id
    logger = MetricLogger(uri, run_id, flush_every_s=0.2)
    for step in range(1, 51):
        logger.log({"train_loss": 1.0 / step}, step)
    assert logger.wait_sent(timeout=30)
    assert logger.unsent() == []
    # What another process could not send arrives with its own step and timestamp.
    logger.requeue([("late_metric", 2.0, 1_000, 5)])
    assert logger.close(timeout=30) == 0
    history = client.get_metric_history(run_id, "train_loss")
    assert sorted(m.step for m in history) == list(range(1, 51))
    (late,) = client.get_metric_history(run_id, "late_metric")
    assert (late.step, late.value, late.timestamp) == (5, 2.0, 1_000)


@pytest.mark.parametrize("as_uri", [False, True])
def test_resumable_checkpoints_names_the_folder_ray_train_would_resume(tmp_path, as_uri):
    """Only a run folder holding Ray Train's checkpoint list counts: a folder with other files
    (the run's config, an unregistered checkpoint) starts from scratch. A URI is read through
    its filesystem. (That Ray Train writes and resumes from this file: the resume job test.)"""
    storage = f"file://{tmp_path}" if as_uri else str(tmp_path)
    run_dir = tmp_path / "run-a"
    (run_dir / "checkpoint_2099-01-01_00-00-00.000000").mkdir(parents=True)
    (run_dir / "resolved_config.yaml").write_text("run: {}\n")
    assert resumable_checkpoints(storage, "run-a") is None
    assert resumable_checkpoints(storage, "run-b") is None
    (run_dir / RESUME_SNAPSHOT).write_text("{}")
    assert resumable_checkpoints(storage, "run-a") == f"{storage}/run-a"
    assert resumable_checkpoints(storage + "/", "run-a") == f"{storage}/run-a"
    assert resumable_checkpoints(storage, "run-b") is None


def test_a_checkpoint_of_the_earlier_plan_format_is_refused_in_one_line():
    """Checkpoints written before plans travelled as their source held the plan's arrays: a
    resume from one says what to do instead of failing on a missing key."""
    saved = {"epoch": 1, "batches_done": 0, "step": 7, "plan": {"version": 1}, "negatives": None}
    with pytest.raises(ValueError, match="earlier version .* start the run under a new run.name"):
        TrainState.from_dict(saved)


def test_the_mlm_head_is_checkpointed_without_the_shared_embeddings_and_restores(tmp_path, tiny_model_dir):
    from pipeline.training.checkpoint import STATE_FILE

    model = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlm=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.tensor([[2, 7, 8, 3]])
    _, scores = model(ids, torch.ones_like(ids), masked=(ids, torch.tensor([[False, True, True, False]])))
    scores.sum().backward()
    optimizer.step()  # the head moves away from its initial weights
    state = TrainState(source=PlanSource(0, seed=1), plan=random_plan(8, 4, seed=1).share(world=1, rank=0))
    save_checkpoint(
        tmp_path,
        model,
        load_tokenizer(tiny_model_dir),
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        max_seq_len=32,
    )
    _, extras = load_checkpoint(tmp_path)
    assert not any(key.startswith("word_embeddings") for key in extras["mlm_head"])
    fresh = load_sentence_encoder(tiny_model_dir, pooler="mean", use_mlm=True)
    assert not torch.equal(fresh.mlm_head.dense.weight, model.mlm_head.dense.weight)
    fresh.mlm_head.load_own_state_dict(extras["mlm_head"])
    for key, value in model.mlm_head.own_state_dict().items():
        assert torch.equal(fresh.mlm_head.state_dict()[key], value), key
    # The head still reads the encoder's own word embeddings, not a copy.
    assert fresh.mlm_head.word_embeddings is fresh.encoder.get_input_embeddings()
    # A checkpoint written before the MLM objective existed restores with no head state.
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)
    del saved["mlm_head"]
    torch.save(saved, tmp_path / STATE_FILE)
    assert load_checkpoint(tmp_path)[1]["mlm_head"] is None
