"""The training job as a user runs it: jobs/train.py in a fresh working directory, a local
Ray started by the job, a real sqlite MLflow store, real FAISS."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PYTHON, REPO, assert_no_alarming_lines, run_script_in_process
from mlflow.tracking import MlflowClient

from bench.common import job_env
from bench.running_job import RunningJob
from pipeline.config.metric_catalogue import MAX_MINING_CHARTS, undeclared
from pipeline.model.accel import native_bf16
from pipeline.tracking.refresh_table import read_refresh_table
from pipeline.training.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

DEMO = str(REPO / "jobs/configs/demo.yaml")


def _run_job(cwd: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    args = [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run(args, cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=timeout)


def _client(cwd: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")


def _only_run(client: MlflowClient, experiment: str = "simcse-demo"):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


@pytest.mark.job
def test_demo_trains_mines_and_logs(tmp_path):
    import mlflow.artifacts
    import mlflow.sentence_transformers
    from transformers import AutoModel, AutoTokenizer

    proc = _run_job(
        tmp_path,
        "train.epochs=3",
        "eval.every_steps=10",
        "checkpoint.every_steps=10",
        "tracking.register_as=demo-encoder",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "SimCSE run 'demo' finished" in out
    assert_no_alarming_lines(proc)
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'mlruns.db'}" in out
    assert "batch plans   v0 (random), v1 (mined), v2 (mined)" in out

    client = _client(tmp_path)
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

    raw = encode_texts(load_sentence_encoder(export), load_tokenizer(export), sentences, 32, 8,
                       torch.device("cpu"), normalize=False)  # fmt: skip
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

    # A second start of a finished run: tests/test_failures.py (the resumed run started again).


@pytest.mark.job
def test_model_folder_and_jsonl_corpus(
    tmp_path, tiny_model_dir, paraphrase_corpus, ray_local, capfd, monkeypatch
):
    """`model.name_or_path` = a HF model folder and `data.path` = a jsonl file with a text column;
    evaluated on a retrieval set only (no STS file), which picks the exported model. The job
    runs in this test process on its Ray: what it shows does not depend on the job's own
    process (the demo's test above runs one)."""
    import json

    texts, groups = paraphrase_corpus
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"sentence": t, "source": "gen"}) + "\n" for t in texts))
    # retrieval pairs: a group's first member finds its second and third (label 1) among them
    # and the next group's members (label 0)
    members: dict[int, list[str]] = {}
    for text, group in zip(texts, groups.tolist(), strict=True):
        members.setdefault(group, []).append(text)
    ordered = list(members.values())
    pairs = tmp_path / "groups.tsv"
    pairs.write_text("".join(
        f"{m[0]}\t{m[1]}\t1\n{m[0]}\t{m[2]}\t1\n{m[0]}\t{ordered[(g + 1) % 60][3]}\t0\n"
        for g, m in enumerate(ordered[:60])
    ))  # fmt: skip
    settings = [
        "run.name=folder",
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={corpus}",
        "data.text_column=sentence",
        "train.epochs=2",
        "train.batch_size=32",
        "train.dup_rate=0.32",  # ESimCSE word repetition on the second view
        "train.group_by_length=true",
        "mining.batch_sampler=knn",  # a refreshed epoch from the other sampler
        "tracking.experiment=folder",
        f"eval.retrieval={pairs}",
        "train.num_workers=1",  # two ranks: the demo test's run; a worker costs ~9 s of CPU to start
    ]
    proc = run_script_in_process(
        "jobs/train.py", ["--config", DEMO, *(a for item in settings for a in ("--set", item))],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch, actor_lines=("[eval] epoch 1 step ",),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(texts)} sentences (0 empty, 0 duplicates dropped)" in proc.stdout
    run = _only_run(_client(tmp_path), "folder")
    # retrieval at the start and both epoch ends; the better epoch's nDCG@10 picked the export
    client, run_id = _client(tmp_path), run.info.run_id
    ndcg = {m.step: m.value for m in client.get_metric_history(run_id, "eval/retrieval_groups_ndcg_at_10")}
    steps_per_epoch = -(-len(texts) // 32)
    assert sorted(ndcg) == [0, steps_per_epoch, 2 * steps_per_epoch]
    assert "eval/score" not in run.data.metrics  # the selected series is not logged twice
    for name in ("mrr_at_10", "recall_at_1", "recall_at_10", "recall_at_100"):
        assert len(client.get_metric_history(run_id, f"eval/retrieval_groups_{name}")) == 3, name
    best_step = max((s for s in ndcg if s > 0), key=ndcg.get)
    assert run.data.tags["simcse.exported_step"] == str(best_step)
    assert run.data.metrics["best/score"] == ndcg[best_step]
    assert float(run.data.tags["best.retrieval_groups_ndcg_at_10"]) == pytest.approx(
        ndcg[best_step], rel=1e-3
    )
    assert (
        "[eval] retrieval groups (60 queries, 180 documents): 240 texts, evaluated at the start"
        in proc.stdout
    )
    assert "[eval] epoch 1 step " in proc.stdout and ": groups ndcg@10 " in proc.stdout
    gain = ndcg[best_step] - ndcg[0]
    assert (
        f"groups ndcg@10 {ndcg[0]:.2f} -> {ndcg[best_step]:.2f} ({gain:+.2f}); exported epoch" in proc.stdout
    )
    assert run.info.status == "FINISHED" and run.data.params["model.name_or_path"] == str(tiny_model_dir)
    assert run.data.params["train.dup_rate"] == "0.32"
    # Epoch 2 trained on the knn sampler's plan, which the checkpoint carries; the miner logged
    # how many of the rows' flagged false negatives share a batch.
    assert [run.data.tags[f"plan.sampler.epoch_{e}"] for e in (1, 2)] == ["random", "knn"]
    state, _ = load_checkpoint(max((p for p in (tmp_path / "runs/folder").glob("checkpoint_*") if p.is_dir()),
                                   key=lambda p: p.stat().st_mtime))  # fmt: skip
    assert state.plan.sampler == "knn" and sorted(state.plan.rows.tolist()) == list(range(len(texts)))
    (refreshed,) = read_refresh_table(_client(tmp_path), run.info.run_id)
    assert 0 <= refreshed["false_negative_pairs_in_batches"] <= refreshed["false_negatives_flagged"]
    # Epoch 1 trained on length-grouped batches: the plan an independent tokenization gives.
    from transformers import AutoTokenizer

    from pipeline.batching.plan import padding_share
    from pipeline.batching.samplers import random_plan
    from pipeline.data.utf8 import stable_row_id

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    max_len = int(run.data.params["data.max_seq_len"])
    lengths = np.array(
        [
            len(tokenizer(t, truncation=True, max_length=max_len)["input_ids"])
            for t in sorted(texts, key=stable_row_id)
        ]
    )
    expected = random_plan(
        len(texts), 32, seed=int(run.data.params["run.seed"]), lengths=lengths, group_batches=50
    )
    assert run.data.tags["plan.fingerprint.epoch_1"] == expected.hex_fingerprint()
    padding = _client(tmp_path).get_metric_history(run.info.run_id, "train/padding_share")
    assert min(padding, key=lambda m: m.step).value == pytest.approx(
        padding_share(expected, lengths, world_size=int(run.data.params["train.num_workers"])), abs=1e-9
    )
    assert (
        expected.fingerprint()
        != random_plan(len(texts), 32, seed=int(run.data.params["run.seed"])).fingerprint()
    )
    # Fine-tuned from the given weights: same architecture and vocabulary as the folder.
    from transformers import AutoConfig

    exported = tmp_path / "runs" / "folder" / "model"
    assert (
        AutoConfig.from_pretrained(exported).hidden_size
        == AutoConfig.from_pretrained(tiny_model_dir).hidden_size
    )
    assert (
        AutoTokenizer.from_pretrained(exported).get_vocab()
        == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    )


@pytest.mark.job
def test_pairs_task_trains_on_given_and_mined_negatives_and_survives_its_miner_killed(
    tmp_path, tiny_model_dir, paraphrase_corpus
):
    """The pairs task on the demo config: given negatives and mined ones (mined with the starting
    weights before epoch 1, refreshed after it), evaluated on STS. The miner is SIGKILLed while
    it mines v2 after epoch 1 (held there by the seam): Ray restarts it from what its calls
    bring (no object-store reference held by the actor), the refresh is submitted again, and
    the job finishes as an uninterrupted one would, with nothing alarming in its output."""
    import json

    texts, groups = paraphrase_corpus
    members: dict[int, list[str]] = {}
    for text, group in zip(texts, groups.tolist(), strict=True):
        members.setdefault(group, []).append(text)
    rows = []
    for group, group_texts in members.items():
        other = members[(group + 7) % len(members)]
        for i in range(2):
            # Half the rows carry a given negative (as NLI contradictions would), half none.
            rows.append(
                {
                    "premise": group_texts[i],
                    "hypothesis": group_texts[i + 1],
                    "contra": other[0] if i == 0 else "",
                }
            )
    data = tmp_path / "triplets.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # An STS file (jsonl): a group's members score 5 with each other, 0 with another group's.
    sts = tmp_path / "dev.jsonl"
    sts.write_text("".join(
        json.dumps({"sentence1": m[0], "sentence2": m[2], "score": 5}) + "\n"
        + json.dumps({"sentence1": m[0], "sentence2": members[(g + 1) % len(members)][3], "score": 0}) + "\n"
        for g, m in list(members.items())[:60]
    ))  # fmt: skip
    overrides = [
        "run.name=sup", f"model.name_or_path={tiny_model_dir}", f"data.path={data}",
        "data.anchor_column=premise", "data.positive_column=hypothesis", "data.negative_column=contra",
        "task=pairs", "mining.batch_sampler=random",  # the demo config's knn is a corpus key
        "mining.num_negatives=2", "mining.random_negatives=1", "mining.refresh=every_epoch",
        "train.hard_negative_weight=0.5",
        "train.epochs=2", "train.batch_size=32", "train.lr=1e-3", "tracking.experiment=sup", f"eval.sts={sts}",
        "train.num_workers=1",  # two ranks: the demo test's run; a worker costs ~9 s of CPU to start
    ]  # fmt: skip
    job = RunningJob(tmp_path, overrides, config=DEMO, holds=("miner_refresh=2",))
    try:
        miner = job.kill_held("miner_refresh=2", "HardNegativeMiner", "the refresh after epoch 1")
        code = job.wait(timeout=600)
    finally:
        job.kill_all()
    out = job.output
    assert code == 0, out[-4000:]
    assert f"{len(rows)} (anchor, positive) rows" in out and f"{len(rows) // 2} with a given negative" in out
    assert (
        "[mining] the miner actor died during refresh v2" in out and "the miner actor was restarted 1x" in out
    )
    # Nothing alarming but Ray's one report of the process the test killed.
    assert_no_alarming_lines(subprocess.CompletedProcess([], 0, out, ""), killed_pids=(miner.pid,))
    client = _client(tmp_path)
    run = _only_run(client, "sup")
    assert run.info.status == "FINISHED" and run.data.params["task"] == "pairs"
    run_id = run.info.run_id
    assert [m.value for m in client.get_metric_history(run_id, "mining/miner_restarts")] == [1.0]
    steps_per_epoch = -(-len(rows) // 32)
    versions = [
        m.value for m in sorted(client.get_metric_history(run_id, "train/plan_version"), key=lambda m: m.step)
    ]
    # Mined with the starting weights before epoch 1 (v1), refreshed after it (v2) once, by the
    # restarted miner.
    assert versions == [1.0, 2.0]
    assert "negatives mined with the starting weights: plan v1" in out
    # ...which the workers really had: the plan in the last checkpoint carries them (it once
    # arrived without them, and epoch 2 trained on the given negatives only).
    folders = [p for p in (tmp_path / "runs/sup").glob("checkpoint_*") if p.is_dir()]
    newest = max(folders, key=lambda p: p.stat().st_mtime)
    state, _ = load_checkpoint(newest)
    assert state.plan.version == 2 and state.negatives.shape == (len(rows), 3)  # 2 mined, 1 random
    assert (state.negatives[:, :2] >= 0).mean() > 0.5 and (state.negatives[:, 2] >= 0).all()
    table = read_refresh_table(client, run_id)
    assert table[0]["random_negatives"] == len(rows)
    assert [(row["step"], row["plan_version"]) for row in table] == [(0, 1.0), (steps_per_epoch, 2.0)]
    # The untrained tiny model ranks few candidates below the positive's margin; after an
    # epoch most anchors find theirs. Anchors left short are counted, never an error.
    assert table[-1]["anchors_short"] < len(rows)
    assert client.get_metric_history(run_id, "mining/negative_similarity_mean")[-1].step == steps_per_epoch
    losses = [m.value for m in client.get_metric_history(run_id, "train/loss")]
    assert len(losses) == 2 * -(-len(rows) // 32) and all(np.isfinite(losses))
    # A histogram per refresh that found negatives (v1 may have found none, see above).
    found = {m.step for m in client.get_metric_history(run_id, "mining/negative_similarity_mean")}
    want = [
        f"mining/negative_similarity_v{v}.png" for v, step in ((1, 0), (2, steps_per_epoch)) if step in found
    ]
    assert sorted(a.path for a in client.list_artifacts(run_id, "mining")) == [*want, "mining/refreshes.json"]
    # evaluation in the pairs task: the start and both epoch ends; the better epoch is exported
    scores = {m.step: m.value for m in client.get_metric_history(run_id, "eval/sts_dev_spearman")}
    assert sorted(scores) == [0, steps_per_epoch, 2 * steps_per_epoch]
    best = max((1, 2), key=lambda epoch: scores[epoch * steps_per_epoch])
    assert run.data.tags["simcse.exported_epoch"] == str(best)
