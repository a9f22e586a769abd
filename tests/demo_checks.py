"""What the demo's run must be, checked on the demo job that tests/test_cotenancy.py runs beside
a submitted copy of itself (each whole job a test starts costs about a minute of CPU on 2
cores): ``jobs/train.py --config jobs/configs/demo.yaml`` with :data:`DEMO_CHECKED` set, in
its own working directory, a local Ray of its own, a sqlite MLflow store there."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_no_alarming_lines
from mlflow.tracking import MlflowClient

from pipeline.config.metric_catalogue import MAX_MINING_CHARTS, undeclared
from pipeline.model.accel import native_bf16
from pipeline.tracking.refresh_table import read_refresh_table

DEMO_CHECKED = [
    "train.epochs=3", "eval.every_steps=10", "checkpoint.every_steps=10", "tracking.register_as=demo-encoder",
]  # fmt: skip
"""The demo with everything on: mid-epoch evaluations and checkpoints, a registered model."""


def _only_run(client: MlflowClient, experiment: str = "simcse-demo"):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def assert_the_demo_run(tmp_path: Path, out: str) -> None:
    """The demo run in ``tmp_path`` (its working directory) trained, mined, evaluated, exported
    and logged what a reviewer needs; ``out`` is the job's output (stdout and stderr)."""
    import mlflow.artifacts
    import mlflow.sentence_transformers
    from transformers import AutoModel, AutoTokenizer

    proc = subprocess.CompletedProcess([], 0, out, "")
    assert "SimCSE run 'demo' finished" in out
    assert_no_alarming_lines(proc)
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'mlruns.db'}" in out
    assert "batch plans   v0 (random), v1 (mined), v2 (mined)" in out

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = _only_run(client)
    run_id = run.info.run_id
    assert run_id in out and run.info.status == "FINISHED"
    params = run.data.params
    assert params["train.temperature"] == "0.05" and params["train.num_workers"] == "2"
    assert params["model.pooler"] == "mean" and "mining.top_k" in params
    # What shaped the model, no null, no infrastructure, at most 40 (issue 39).
    assert len(params) <= 40 and "null" not in params.values() and "ray.num_cpus" not in params, sorted(
        params
    )
    # The params name the files the run really used, generated ones included.
    assert params["data.path"] == str(tmp_path / "runs/demo/generated_corpus.txt")
    assert str(tmp_path / "runs/demo/generated_sts.tsv") in params["eval.sts"]
    assert int(params["data/rows"]) > 1500 and int(run.data.tags["data.duplicates_dropped"]) > 0
    assert not {"data.sentences", "data.texts", "data.triplets"} & set(run.data.tags)  # params already say
    # The runs table's Source column: the job and the commit it ran from.
    assert (
        run.data.tags["mlflow.source.name"] == "jobs/train.py"
        and run.data.tags["mlflow.source.type"] == "JOB"
    )
    assert len(run.data.tags["mlflow.source.git.commit"]) == 40
    # The forward passes ran in bf16 exactly where this CPU computes it natively; the miner's
    # encodes in fp32 on any CPU.
    native = "bf16" if native_bf16(torch.device("cpu")) else "fp32"
    assert run.data.tags["simcse.forward_dtype"] == native
    assert run.data.tags["simcse.mining_dtype"] == "fp32"

    losses = client.get_metric_history(run_id, "train/loss")
    steps = sorted(m.step for m in losses)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == 3 * 25  # 1600 rows / 64
    assert {"train/learning_rate", "train/sentences_per_s"} <= set(run.data.metrics)
    epoch_loss = [
        m.value for m in sorted(client.get_metric_history(run_id, "train/epoch_loss"), key=lambda m: m.step)
    ]
    assert len(epoch_loss) == 3 and epoch_loss[-1] < 0.5 * epoch_loss[0]  # the loss fell
    versions = [
        m.value for m in sorted(client.get_metric_history(run_id, "train/plan_version"), key=lambda m: m.step)
    ]
    assert versions == [0.0, 1.0, 2.0]  # epochs 2 and 3 trained on mined plans
    # Every diagnostic of a refresh is one row of the refresh table; the charts are the few
    # that move (mining/total_s, the plan's hardness, churn).
    table = read_refresh_table(client, run_id)
    assert [row["plan_version"] for row in table] == [1.0, 2.0]
    for row in table:
        assert {"encode_s", "index_s", "search_s", "corpus_size", "top1_similarity_mean"} <= set(row)
        assert {"removed_duplicate", "removed_rank_window", "kept", "batch_similarity_p90"} <= set(row)
        assert row["corpus_size"] == int(run.data.params["data/texts"])
        assert row["batch_similarity_mean"] > row["random_batch_similarity_mean"]  # mined batches are harder
    assert "churn" not in table[0] and 0 < table[1]["churn"] <= 1  # the second refresh vs the first
    charted = {m.step: m.value for m in client.get_metric_history(run_id, "mining/batch_similarity_mean")}
    # the table keeps 4 significant digits
    assert charted == {
        int(row["step"]): pytest.approx(row["batch_similarity_mean"], rel=5e-4) for row in table
    }
    assert len(client.get_metric_history(run_id, "mining/total_s")) == 2
    assert "mining/corpus_size" not in run.data.metrics and "mining/kept" not in run.data.metrics
    histograms = sorted(a.path for a in client.list_artifacts(run_id, "mining"))
    assert histograms == [
        "mining/negative_similarity_v1.png",
        "mining/negative_similarity_v2.png",
        "mining/refreshes.json",
    ]

    # STS at the start, every 10 steps and every epoch end; the best evaluation after the start
    # (by the first file's Spearman), mid-epoch or not, is exported, although newer checkpoints
    # replaced its own.
    key = "eval/sts_generated_sts_spearman"
    history = {m.step: m.value for m in client.get_metric_history(run_id, key)}
    assert sorted(history) == [0, 10, 20, 25, 30, 40, 50, 60, 70, 75]
    for name in ("alignment", "uniformity"):
        assert len(client.get_metric_history(run_id, f"eval/sts_generated_sts_{name}")) == 10
    assert not any("whitened" in k for k in run.data.metrics)  # training fits no whitening
    best_step = max((step for step in sorted(history) if step > 0), key=history.get)
    best = best_step / 25
    assert run.data.tags["simcse.exported_step"] == str(best_step)
    assert run.data.tags["simcse.exported_epoch"] == f"{best:g}"
    assert f"exported epoch {best:g} (step {best_step}, best of 9 evaluations after training; " in out
    # checkpoint.keep_last: the newest two of 10 (7 mid-epoch + 3 epoch ends) stay on disk, and
    # they are the ones Ray Train has registered (its snapshot file sits beside them).
    kept = sorted(p.name for p in (tmp_path / "runs/demo").glob("checkpoint_*") if p.is_dir())
    snapshot = json.loads((tmp_path / "runs/demo/checkpoint_manager_snapshot.json").read_text())
    registered = [r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]]
    assert len(kept) == 2 and sorted(registered) == kept
    assert max(r["metrics"]["step"] for r in snapshot["checkpoint_results"]) == 75

    from pipeline.evaluation.scoring import evaluate_model_dir

    export = tmp_path / "runs/demo/model"
    assert not (export / "2_Dense").exists()  # no whitening layer
    rescored = evaluate_model_dir(export, [str(tmp_path / "runs/demo/generated_sts.tsv")], max_seq_len=32)
    assert rescored[0].spearman == pytest.approx(history[best_step], abs=0.05)

    # The run's model is its output at the exported step, and the metrics MLflow shows on the
    # model's page are that model's own evaluation (not the untrained model's at step 0).
    (output,) = run.outputs.model_outputs
    assert output.step == best_step
    logged = client.get_logged_model(output.model_id)
    linked = {m.key: m for m in logged.metrics}
    # its evaluation at the exported step, its best/ scores as the run's one-point (bar) metrics
    assert {(m.key.split("/")[0], m.step) for m in logged.metrics} == {("eval", best_step), ("best", 0)}
    assert linked[key].value == pytest.approx(rescored[0].spearman, abs=0.05)
    assert not any(k.startswith(("system/", "train/", "mining/")) for k in linked)
    # A model a registry user recognises: named after the run, described, and tagged with the
    # data it was trained on (the run's dataset digest).
    assert logged.name == "demo"
    description = logged.tags["mlflow.note.content"]
    assert description.startswith("SimCSE fine-tune of a tiny BERT (random weights)")
    assert f"Shipped the model of step {best_step} (selected by sts_generated_sts_spearman)" in description
    assert "generated_sts spearman" in description and "generated_corpus.txt" in description
    assert logged.tags["data.digest"] == run.data.tags["data.digest"] and logged.tags["source_run"] == run_id
    # Its scores under stable names, to sort and compare runs on what they ship.
    metrics = run.data.metrics
    assert run.data.tags["simcse.exported_step"] == str(best_step) and "best/step" not in metrics  # a tag
    assert metrics["best/score"] == history[best_step]  # the first file's Spearman selects
    assert linked["best/score"].value == history[best_step]
    assert {k for k in metrics if k.startswith("best/")} == {"best/score"}  # one bar, not 8
    assert [m.step for m in client.get_metric_history(run_id, "best/score")] == [0]  # a bar
    assert "eval/score" not in metrics  # it would repeat the select_by series
    tags = run.data.tags
    assert float(tags["best.sts_generated_sts_spearman"]) == pytest.approx(history[best_step], rel=1e-3)
    best_runs = client.search_runs([run.info.experiment_id], order_by=["metrics.`best/score` DESC"])
    assert best_runs[0].info.run_id == run_id

    # Chart sections: every metric sits under train/, eval/, mining/, best/ or system/ and is
    # declared in the metric catalogue; the data/ values, which never change, are params, and
    # the plan fingerprint is a tag per epoch, not a chart.
    sections = {k.split("/", 1)[0] for k in metrics}
    assert sections == {"train", "eval", "mining", "best", "system"}, sorted(metrics)
    # A sync run charts no async-only series (they would be flat zeros), and every per-epoch
    # value sits at its epoch's last step.
    assert "mining/refresh_wait_s" in metrics and "mining/refresh_late" not in metrics
    assert "mining/next_plan_staleness_steps" not in metrics

    def steps(key: str) -> list[int]:
        return sorted(m.step for m in client.get_metric_history(run_id, key))

    assert steps("train/padding_share") == steps("train/epoch_loss") == steps("train/epoch_seconds")
    assert undeclared(set(metrics), kinds=("chart", "summary", "system")) == []
    assert len([k for k in metrics if k.startswith("mining/")]) <= MAX_MINING_CHARTS
    assert (
        undeclared({f"mining/{k}" for row in table for k in row if k != "step"}, kinds=("chart", "table"))
        == []
    )
    assert int(params["data/rows"]) == 1600 and float(params["data/truncated_share"]) >= 0
    assert (
        "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    )
    # At the default interval (10 s), a run of a minute still has its CPU and memory charts: the
    # driver samples its machine a second in, every interval, and once more at the end.
    cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert len(cpu) >= 2 and all(0 <= m.value <= 100 for m in cpu) and any(m.value > 0 for m in cpu)
    assert not any(k.startswith("system/node_") for k in metrics)  # one machine, one set
    fingerprints = [run.data.tags[f"plan.fingerprint.epoch_{e}"] for e in (1, 2, 3)]
    assert all(len(f) == 12 for f in fingerprints) and len(set(fingerprints)) == 3
    # Epoch 1 is random; the refreshed epochs were planned by the configured sampler.
    samplers = [run.data.tags[f"plan.sampler.epoch_{e}"] for e in (1, 2, 3)]
    assert samplers == ["random"] + [params["mining.batch_sampler"]] * 2

    assert "resolved_config.yaml" in [a.path for a in client.list_artifacts(run_id)]
    review = sorted(a.path for a in client.list_artifacts(run_id, "review"))
    assert review == [
        f"review/{n}"
        for n in ("alignment_uniformity.png", "eval_by_epoch.md", "loss.png", "sts_by_epoch.png")
    ]
    table = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="review/eval_by_epoch.md",
                                                     tracking_uri=client.tracking_uri)).read_text()  # fmt: skip
    assert f"| {best:g} (best) | {best_step} |" in table
    # The description: the headline (data, shipped score against the start), then short lines.
    note = run.data.tags["mlflow.note.content"].splitlines()
    headline = " ".join(note[: note.index("")])
    assert headline.startswith(
        "SimCSE run 'demo' fine-tuned a tiny BERT (random weights) on generated_corpus.txt: 1600 sentences"
    )
    # The start, the shipped score and their difference; nothing of this machine's folders.
    assert re.search(r"generated_sts spearman \d+\.\d\d -> \d+\.\d\d \([+-]\d+\.\d\d\)", headline), headline
    assert str(tmp_path) not in run.data.tags["mlflow.note.content"]
    assert "generated_sts spearman" in " ".join(note[:3])
    # and says what that score is worth: the untrained model already follows the generated set
    assert "Note: generated_sts is generated: its gold score is the word overlap" in headline, headline
    assert (
        headline.endswith("not that the model improved.")
        and "  eval set      generated_sts is generated" in out
    )
    assert all(len(line) <= 100 or len(line.split()) == 1 for line in note)
    # dataset fingerprint, commit and versions for comparing runs
    # and the datasets it read: the training corpus with its schema, the STS file it was scored on
    inputs = {{t.value for t in d.tags}.pop(): d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "eval"}
    assert inputs["training"].digest == run.data.tags["data.digest"] and len(inputs["training"].digest) == 16
    assert json.loads(inputs["training"].schema)["mlflow_colspec"][0]["name"] == "text"
    assert inputs["eval"].name == "generated_sts" and json.loads(inputs["eval"].profile)["kind"] == "sts"
    assert run.data.tags["versions.torch"] == torch.__version__ and "versions.ray" in run.data.tags

    # The run's MLflow model (sentence-transformers flavor), registered under the configured name,
    # gives the pipeline's embeddings; so does AutoModel with the pooling.
    (version,) = client.search_model_versions("name='demo-encoder'")
    assert version.run_id == run_id and f"  registered    demo-encoder/{version.version}" in out
    assert float(version.tags["eval/sts_generated_sts_spearman"]) == pytest.approx(
        history[best_step], abs=1e-3
    )
    assert version.tags["source_run"] == run_id and version.description == description
    assert version.tags["data.digest"] == run.data.tags["data.digest"]
    sentences = ["Zonouku pai nabrou.", "Truvikai voze noura."]
    from pipeline.model.encode import encode_texts
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import load_tokenizer

    raw = encode_texts(load_sentence_encoder(export), load_tokenizer(export), sentences, max_seq_len=32, batch_size=8,
                       device=torch.device("cpu"), normalize=False)  # fmt: skip
    mlflow.set_tracking_uri(client.tracking_uri)  # models:/ URIs resolve against the global registry
    registered = mlflow.sentence_transformers.load_model(f"models:/demo-encoder/{version.version}")
    assert np.abs(registered.encode(sentences) - raw).max() < 1e-5
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModel.from_pretrained(export).eval()
    with torch.no_grad():
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        hf = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert np.abs(raw - hf).max() < 1e-5
