"""What a reviewer reads off a run, checked without training: the shipped model's ``best/``
scores, tags sent in the background, where the git commit comes from, the summary's
evaluation count, and a tokenizer that is the same on every run."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from mlflow.tracking import MlflowClient

from pipeline.evaluation.exported import best_model_metrics, best_model_tags, exported_eval_metrics
from pipeline.tracking.context import GIT_COMMIT_ENV, git_commit, job_source
from pipeline.tracking.metric_logger import MetricLogger

HISTORY = [
    {"epoch": 0.0, "step": 0.0, "sts_dev_spearman": 70.0, "sts_dev_alignment": 0.1, "eval_score": 70.0},
    {"epoch": 1.0, "step": 25.0, "sts_dev_spearman": 80.0, "sts_dev_alignment": 0.2, "eval_score": 80.0},
    {"epoch": 2.0, "step": 50.0, "sts_dev_spearman": 78.0, "sts_dev_alignment": 0.3, "eval_score": 78.0},
]


def test_best_metrics_are_the_exported_evaluation_under_stable_names():
    # Two metrics to sort and filter runs on; every score as a tag for the runs table's columns.
    assert best_model_metrics(HISTORY, exported_step=25) == {"best/score": 80.0}
    assert best_model_tags(HISTORY, exported_step=25) == {
        "best.sts_dev_spearman": "80",
        "best.sts_dev_alignment": "0.2",
    }
    # No evaluation at the exported step (evaluation off): only where the model comes from.
    assert best_model_metrics([], exported_step=50) == {}
    assert best_model_tags([], exported_step=50) == {}


def test_linked_model_metrics_are_the_exported_evaluation_as_logged():
    """The logged model is linked to its evaluation under the names the run logged it with
    (eval_metric_names), beside its best/ scores."""
    assert exported_eval_metrics(HISTORY, exported_step=25) == {
        "eval/sts_dev_spearman": 80.0,
        "eval/sts_dev_alignment": 0.2,
    }  # the selection score repeats the select_by metric's series: best/score only
    assert exported_eval_metrics(HISTORY, exported_step=30) == {}  # not evaluated there


def test_summary_counts_the_evaluations_that_could_be_exported():
    from pipeline.jobs.summary import JobSummary
    from pipeline.training.state import BestModel, TrainHistory

    summary = JobSummary.from_training(
        "r", "id", "sqlite:///x.db", "e", corpus="c", history=TrainHistory(evaluations=HISTORY), steps=50,
        best=BestModel(score=80.0, epoch=1.0, step=25), model_dir=Path("m"),
    )  # fmt: skip
    assert (summary.exported_epoch, summary.exported_step, summary.model_dir) == (1.0, 25, "m")
    line = summary.sts_line()
    assert line is not None and line.startswith(
        "dev spearman 70.00 -> 80.00 (+10.00); exported epoch 1 (step 25"
    )
    assert "best of 2 evaluations after training; the starting model's is the 'before'" in line


def test_the_run_description_puts_the_headline_first_in_short_lines():
    from pipeline.jobs.summary import JobSummary
    from pipeline.training.state import BestModel, TrainHistory

    summary = JobSummary.from_training(
        "r", "id", "sqlite:///" + "/very/long/folder" * 8 + "/mlruns.db", "e", corpus="1600 sentences",
        history=TrainHistory(evaluations=HISTORY, epoch_losses=[1.0, 0.5], plan_versions=[0, 1]), steps=50,
        best=BestModel(score=80.0, epoch=1.0, step=25), model_dir=Path("/very/long/folder/m"),
        base_model="all-MiniLM-L6-v2", data_name="train.tsv",
    )  # fmt: skip
    text = summary.description()
    lines = text.splitlines()
    assert "```" not in text and all(len(line) <= 100 or len(line.split()) == 1 for line in lines)
    # Nothing of this machine's folders: no model folder, no `mlflow ui` command for its store.
    assert "/very/long/folder" not in text and "mlflow ui" not in text
    headline = " ".join(lines[: lines.index("")])
    assert headline == (
        "SimCSE run 'r' fine-tuned all-MiniLM-L6-v2 on train.tsv: 1600 sentences, 2 epochs (50 steps). "
        "Shipped the model of step 25: dev spearman 70.00 -> 80.00 (+10.00)."
    )
    # Every console line but the local ones is an item, its words all there in order.
    items = [" ".join(chunk.split()) for chunk in text.split("\n- ")[1:]]
    console = summary.render(local_paths=False).splitlines()[1:]
    assert len(console) == len(summary.render().splitlines()[1:]) - 2
    assert len(items) == len(console)
    for item, line in zip(items, console, strict=True):
        label, _, value = line.strip().partition("  ")
        assert item == f"**{label}**: {' '.join(value.split())}"


def test_metric_logger_sends_tags_with_the_metrics(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("tags")).info.run_id
    logger = MetricLogger(uri, run_id, flush_every_s=0.2)
    logger.set_tags({"plan.fingerprint.epoch_1": "00ab", "plan.fingerprint.epoch_2": "00cd"})
    logger.log({"train/loss": 1.0}, 1)
    logger.set_tags({"plan.fingerprint.epoch_2": "00ef"})  # a later value wins
    assert logger.close(timeout=30) == 0
    tags = client.get_run(run_id).data.tags
    assert tags["plan.fingerprint.epoch_1"] == "00ab" and tags["plan.fingerprint.epoch_2"] == "00ef"
    assert [m.value for m in client.get_metric_history(run_id, "train/loss")] == [1.0]


def test_the_source_is_the_job_script_in_the_repository_else_the_commands_name(tmp_path):
    assert job_source(str(REPO / "jobs/train.py")) == "jobs/train.py"
    assert job_source(str(REPO / "jobs" / ".." / "jobs/mine.py")) == "jobs/mine.py"
    assert job_source(str(tmp_path / "bin" / "raysimcse")) == "raysimcse"


def test_git_commit_from_the_checkout_else_from_the_submitter(tmp_path, monkeypatch):
    monkeypatch.delenv(GIT_COMMIT_ENV, raising=False)
    outside = tmp_path / "uploaded_working_dir"  # as ray job submit unpacks it: no .git
    outside.mkdir()
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=outside, capture_output=True).returncode == 0:
        pytest.skip("the temp folder lies inside a git checkout")
    commit, why = git_commit(outside)
    assert commit is None and GIT_COMMIT_ENV in why
    monkeypatch.setenv(GIT_COMMIT_ENV, "abc123")
    assert git_commit(outside) == ("abc123", GIT_COMMIT_ENV)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout's own commit wins over the variable
        assert git_commit(REPO) == (head.stdout.strip(), "checkout")


BUILD_TOKENIZER = """
import sys
from pipeline.model.tiny import BertShape, build_random_bert_dir
from pipeline.data.synthetic import generate_paraphrase_corpus

texts, _ = generate_paraphrase_corpus(num_groups=300, seed=0)
build_random_bert_dir(texts, sys.argv[1], max_seq_len=32, dropout=0.1, seed=7,
                      shape=BertShape(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=1500))
"""


def test_tiny_model_is_the_same_in_every_process(tmp_path):
    """The WordPiece trainer's ids used to depend on each process's hash seed."""
    digests = []
    for name in ("a", "b", "c"):
        folder = tmp_path / name
        subprocess.run(
            [sys.executable, "-c", BUILD_TOKENIZER, str(folder)], cwd=REPO, check=True, timeout=300
        )
        digests.append(
            tuple(
                hashlib.sha256((folder / f).read_bytes()).hexdigest()
                for f in ("tokenizer.json", "model.safetensors")
            )
        )
    assert digests[0] == digests[1] == digests[2]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a")
    # Only the five BERT specials are special; continuation pieces are ordinary vocabulary.
    assert sorted(tokenizer.all_special_tokens) == sorted(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    assert len(tokenizer) == 1500 and any(t.startswith("##") for t in tokenizer.get_vocab())
    ids = tokenizer("zonouku pai")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert Path(tmp_path / "a" / "config.json").is_file()


def test_the_job_writes_logs_and_trains_on_one_resolved_config(tmp_path, monkeypatch):
    """run_train_job leaves the caller's config as it was; resolved_config.yaml, the run's
    params and the config handed to training (the workers' LoopConfig.config) are one config,
    with the run name and the generated files filled in."""
    import copy
    import dataclasses

    import pipeline.jobs.train_job as job
    from pipeline.config.loading import dump_yaml, load_config
    from pipeline.config.params import params_in_effect
    from pipeline.jobs.summary import JobSummary

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(REPO / "jobs/configs/demo.yaml")
    before = copy.deepcopy(cfg)
    handed = []

    def train_in_ray(
        resolved,
        tracked,
        *,
        storage_root,
        sts_files,
        echo,
        retrieval_sets=None,
        debug=False,
        joined_cluster=True,
    ):
        handed.append((resolved, sts_files))
        return JobSummary(
            resolved.run.name, tracked.run_id, tracked.tracking_uri, resolved.tracking.experiment
        )

    # The job starts its own local Ray and opens a real MLflow store; only the training inside
    # the Ray session is replaced by a recorder of what it was handed.
    monkeypatch.setattr(job, "train_in_ray", train_in_ray)
    summary = job.run_train_job(cfg, echo=lambda _line: None)

    assert cfg == before and cfg.data.path is None and cfg.eval.sts == []
    ((resolved, sts_files),) = handed
    run_dir = tmp_path / "runs/demo"
    assert resolved.run.name == "demo" == summary.run_name
    assert resolved.data.path == str(run_dir / "generated_corpus.txt")
    assert resolved.eval.sts == [str(run_dir / "generated_sts.tsv")]
    assert [f.name for f in sts_files] == ["generated_sts"]
    # The generated STS set is said to be what it is wherever its score is reported; a
    # configured set gets no such note.
    from pipeline.jobs.shipped_model import generated_sts_note

    assert generated_sts_note(resolved, run_dir).startswith(
        "generated_sts is generated: its gold score is the word overlap"
    )
    elsewhere = dataclasses.replace(resolved.eval, sts=[str(tmp_path / "generated_sts.tsv")])
    assert generated_sts_note(dataclasses.replace(resolved, eval=elsewhere), run_dir) == ""
    # Named once: the metric that picks the export, and the format the corpus is read in.
    assert resolved.eval.select_by == "sts_generated_sts_spearman" and resolved.data.format == "text"
    assert dataclasses.replace(resolved, data=before.data, eval=before.eval) == before  # nothing else
    assert (run_dir / "resolved_config.yaml").read_text() == dump_yaml(resolved)
    assert load_config(run_dir / "resolved_config.yaml") == resolved
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}").get_run(summary.run_id)
    # The params are the resolved values in effect (the whole config is the artifact).
    in_effect = params_in_effect(resolved, generated_data=True)
    assert run.data.params == {k: str(v) for k, v in in_effect.items()}
    assert "train.hard_negative_weight" not in run.data.params and "null" not in run.data.params.values()
    assert "train.gpus_per_worker" not in run.data.params  # resources: resolved_config.yaml only
    assert run.data.params["data.generated.num_groups"] == str(resolved.data.generated.num_groups)
    assert run.info.status == "FINISHED"
