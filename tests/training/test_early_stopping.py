"""Early stopping (``eval.patience``): the rule on a history, the config's checks, and a real
job that stops where its own logged evaluations say it must and still exports the best model."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import PYTHON, REPO, assert_no_alarming_lines
from mlflow.tracking import MlflowClient

from bench.common import job_env
from pipeline.config.eval_section import EvalSection
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.evaluation.in_training import check_eval_sets
from pipeline.training.state import BestModel, TrainHistory


def _history(scores: list[float]) -> TrainHistory:
    """A history of one evaluation per epoch (epoch 0: the start), the best kept as the
    worker keeps it: strictly higher than every earlier one after the start."""
    history = TrainHistory()
    for epoch, score in enumerate(scores):
        history.evaluations.append({"epoch": float(epoch), "step": float(10 * epoch), "score": score})
        if epoch > 0 and (history.best is None or score > history.best.score):
            history.best = BestModel(score, float(epoch), 10 * epoch)
    return history


@pytest.mark.parametrize(
    ("scores", "since_best"),
    [
        ([50.0], 0),  # only the start: nothing to count
        ([90.0, 80.0], 0),  # the first trained evaluation is the best, however it compares to the start
        ([50.0, 60.0, 70.0], 0),
        ([50.0, 70.0, 60.0], 1),
        ([50.0, 70.0, 70.0, 69.0], 2),  # a tie does not beat the best
        ([50.0, 70.0, 60.0, 71.0, 65.0], 1),
    ],
)
def test_evaluations_since_best_counts_what_patience_counts(scores, since_best):
    assert _history(scores).evaluations_since_best() == since_best


def test_patience_is_checked_against_what_the_job_evaluates():
    with pytest.raises(
        ConfigError, match=r"^eval\.patience must be >= 0 \(0: no early stopping\) \(got -1\)$"
    ):
        load_config(None, ["eval.patience=-1"])
    with pytest.raises(ConfigError) as info:
        check_eval_sets(EvalSection(patience=2), [], [])
    assert str(info.value) == (
        "eval.patience=2 needs an evaluation to stop on: set eval.sts or eval.retrieval"
    )
    check_eval_sets(EvalSection(patience=2), ["stsb-dev"], [])  # an STS file is enough


@pytest.mark.slow
@pytest.mark.job
def test_a_run_stops_where_its_evaluations_say_and_exports_the_best(tmp_path):
    """The demo's generated STS set scores Recall@1 = 100 from the start (issue 39 says why),
    so selecting by it, the first trained evaluation is a best that nothing can beat: with
    patience 1 the run must end after epoch 2 of 4, with the model of epoch 1. The stop epoch
    is also recomputed from the evaluations the run logged, independently of the worker. The
    demo refreshes every epoch, so the refresh submitted after epoch 2's last step is under
    way when the run stops: it is let finish and dropped, and the job ends cleanly."""
    metric = "sts_generated_sts_recall_at_1"
    overrides = [
        "train.epochs=4", "eval.patience=1", f"eval.select_by={metric}", "data.generated.num_groups=100",
    ]  # fmt: skip
    args = [PYTHON, str(REPO / "jobs/train.py"), "--config", str(REPO / "jobs/configs/demo.yaml")]
    for item in overrides:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert_no_alarming_lines(proc)
    assert "batch plans   v0 (random), v1 (mined)\n" in out and "dropped refresh" not in out

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("simcse-demo").experiment_id])
    scores = {int(m.step): m.value for m in client.get_metric_history(run.info.run_id, f"eval/{metric}")}
    epoch_ends = [int(m.step) for m in client.get_metric_history(run.info.run_id, "train/epoch_loss")]
    # Independently: the first epoch end (after the first) whose score does not beat every
    # earlier trained one.
    trained = [scores[step] for step in epoch_ends]
    expected_epochs = next(
        (e + 1 for e in range(1, len(trained)) if trained[e] <= max(trained[:e])), len(trained)
    )
    assert len(epoch_ends) == expected_epochs == 2, (scores, epoch_ends)
    assert "[train] early stop after epoch 2/4: the last 1 evaluation did not beat epoch 1" in out
    assert re.search(
        r"\[train\] epoch 2/4: loss \S+ over \d+ steps on plan v1, \S+s; no next epoch\n", out
    ), out
    assert "epochs        2 (" in out and "stopped early" in out
    steps_per_epoch = epoch_ends[0]
    assert f"exported epoch 1 (step {steps_per_epoch}," in out
    assert run.info.status == "FINISHED" and run.data.params["eval.patience"] == "1"
