"""Retrieval fine-tuning in the pairs task, as a user runs the recipe on their own files: a headerless
``headline<TAB>tweet<TAB>label`` file read as it is, a separate candidate pool, a BEIR dev folder;
negatives mined with the starting weights before epoch 1, then refreshed (async here, both
boundary branches) or kept (``mining.refresh=once``), and the offline job mining the same
negatives from the same pool. The pairs task's miner killed in a refresh: tests/test_end_to_end.py.

Files are laid out like ../shared/data/twitter-url (which tests never read), made from the
generated paraphrase groups: each group's first sentence is a headline, the next two its
paraphrase tweets (label 1), a sentence of another group a label-0 tweet.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REPO,
    assert_clean_negatives,
    assert_no_alarming_lines,
    run_script_in_process,
    write_beir,
)
from mlflow.tracking import MlflowClient

from bench.common import set_flags
from pipeline.config.loading import load_config
from pipeline.core.seams import ASYNC_BOUNDARIES_ENV
from pipeline.data.pairs import index_pairs, load_pairs
from pipeline.data.triplets import index_triplets
from pipeline.tracking.refresh_table import read_refresh_table
from pipeline.training.checkpoint import load_checkpoint
from pipeline.training.plan_source import read_negatives, whole_plan

pytestmark = pytest.mark.slow

RECIPE = str(REPO / "jobs/configs/recipe-twitter-url.yaml")
TRAIN_GROUPS, DEV_GROUPS, DISTRACTOR_GROUPS = 120, 24, 40
BATCH = 16


@pytest.fixture(scope="module")
def twitter_like(tmp_path_factory, paraphrase_corpus) -> dict[str, Path]:
    texts, groups = paraphrase_corpus
    members: dict[int, list[str]] = {}
    for text, group in zip(texts, groups.tolist(), strict=True):
        members.setdefault(group, []).append(text)
    ordered = [members[g] for g in sorted(members) if len(members[g]) >= 4]
    train, dev = ordered[:TRAIN_GROUPS], ordered[TRAIN_GROUPS : TRAIN_GROUPS + DEV_GROUPS]
    distractors = ordered[TRAIN_GROUPS + DEV_GROUPS :][:DISTRACTOR_GROUPS]
    root = tmp_path_factory.mktemp("twitter_like")
    rows = []
    for i, group in enumerate(train):
        headline = group[0]
        rows += [(headline, group[1], 1), (headline, group[2], 1)]
        rows.append((headline, train[(i + 5) % len(train)][3], 0))
    (root / "train.tsv").write_text("".join(f"{a}\t{b}\t{label}\n" for a, b, label in rows))
    pool = [g[k] for g in train for k in (1, 2, 3)] + [t for g in distractors for t in g]
    (root / "pool.txt").write_text("".join(f"{t}\n" for t in pool))
    beir = write_beir(
        root / "dev",
        queries={f"q{i}": g[0] for i, g in enumerate(dev)},
        docs={f"d{i}-{k}": g[k] for i, g in enumerate(dev) for k in (1, 2, 3)},
        qrels=[(f"q{i}", f"d{i}-{k}", 1) for i in range(len(dev)) for k in (1, 2)],
    )
    return {"train": root / "train.tsv", "pool": root / "pool.txt", "dev": beir}


def _settings(files: dict[str, Path], model_dir: Path, *overrides: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", f"data.path={files['train']}", f"data.pool={files['pool']}",
        "data.pool_format=text", f"eval.retrieval=[{files['dev']}]", "train.epochs=2",
        f"train.batch_size={BATCH}", "train.lr=1e-3", "train.warmup_ratio=0", "train.cpus_per_worker=1",
        "mining.num_cpus=1", "tracking.experiment=pairs", *overrides,
    ]  # fmt: skip


def _argv(files: dict[str, Path], model_dir: Path, *overrides: str) -> list[str]:
    return ["--config", RECIPE, *set_flags(_settings(files, model_dir, *overrides))]


def _train_here(cwd: Path, files: dict[str, Path], model_dir: Path, *overrides: str, capfd, monkeypatch):
    """jobs/train.py in this test process, on its Ray (the test holds ``ray_local``); its stdout
    ends with what the job's actors printed."""
    argv = _argv(files, model_dir, *overrides)
    return run_script_in_process(
        "jobs/train.py", argv, cwd=cwd, capfd=capfd, monkeypatch=monkeypatch, actor_output=True
    )


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _run(cwd: Path, name: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")
    (run,) = client.search_runs(
        [client.get_experiment_by_name("pairs").experiment_id], f"attributes.run_name = '{name}'"
    )
    return client, run


# Async refresh over 4 epochs of 15 steps, its boundaries scripted through the seam (otherwise
# they are a matter of timing): the refresh submitted 5 steps before epoch 1's end is ready at
# its boundary; the one submitted 5 steps before epoch 2's end is late there, so epoch 3 keeps
# the plan, and it is adopted at the end of epoch 3, an epoch more stale.
EPOCHS, LEAD_STEPS = 4, 5


@pytest.mark.job
def test_refreshed_pairs_async_mine_before_epoch_one_and_evaluate_retrieval(
    tmp_path, twitter_like, tiny_model_dir, ray_local, capfd, monkeypatch
):
    # The seam reaches rank 0 in its runtime_env (pipeline.core.seams.actor_runtime_env).
    monkeypatch.setenv(ASYNC_BOUNDARIES_ENV, "ready,late,ready")
    proc = _train_here(
        tmp_path, twitter_like, tiny_model_dir, "run.name=refreshed", f"train.epochs={EPOCHS}",
        "mining.refresh=every_epoch_async", f"mining.max_staleness_steps={LEAD_STEPS}",
        capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = 2 * TRAIN_GROUPS
    assert f"{rows} (anchor, positive) rows of {3 * TRAIN_GROUPS} read" in proc.stdout
    assert "negatives mined with the starting weights: plan v1" in proc.stdout
    assert_no_alarming_lines(proc)
    client, run = _run(tmp_path, "refreshed")
    assert run.info.status == "FINISHED"
    run_id, steps = run.info.run_id, -(-rows // BATCH)
    e1, e2, e3, e4 = (k * steps for k in range(1, EPOCHS + 1))
    # v1 mined before epoch 1 (step 0); v2 from the weights LEAD_STEPS before epoch 1's end, ready
    # there; v3 from LEAD_STEPS before epoch 2's end, late there, adopted at the end of epoch 3.
    table = read_refresh_table(client, run_id)
    assert {int(row["step"]): row["plan_version"] for row in table} == {
        0: 1.0, e1 - LEAD_STEPS: 2.0, e2 - LEAD_STEPS: 3.0,
    }  # fmt: skip
    # Every epoch end is a boundary; the last one (e4) asks no miner and keeps v3.
    assert _history(client, run_id, "mining/refresh_late") == [
        (0, 0.0),
        (e1, 0.0),
        (e2, 1.0),
        (e3, 0.0),
        (e4, 0.0),
    ]
    staleness = _history(client, run_id, "mining/next_plan_staleness_steps")
    assert staleness == [(0, 0.0), (e1, LEAD_STEPS), (e2, 0.0), (e3, LEAD_STEPS + steps), (e4, 0.0)]
    assert {e1, e2, e3, e4} <= {s for s, _ in _history(client, run_id, "mining/refresh_wait_s")}
    # The plan each epoch trained on, logged at its end: the late boundary kept v2.
    assert _history(client, run_id, "train/plan_version") == [(e1, 1.0), (e2, 2.0), (e3, 2.0), (e4, 3.0)]
    assert "the refresh under way was not ready: plan kept, reshuffled" in proc.stdout
    assert "training waited" in proc.stdout
    # Every known positive of an anchor is kept out of its candidates: each headline has two
    # paraphrase rows, the other one's tweet is a known positive, never a negative.
    assert table[0]["step"] == 0 and sum(row["removed_known_positive"] for row in table) > 0
    # The pool: the pool file's distinct texts (which hold every positive here).
    assert table[0]["corpus_size"] == len(set(twitter_like["pool"].read_text().split("\n")) - {""})
    # Retrieval evaluation at the start and at every epoch end; the exported model scores
    # offline what it scored in training.
    ndcg = dict(_history(client, run_id, "eval/retrieval_dev_ndcg_at_10"))
    assert sorted(ndcg) == [0, e1, e2, e3, e4]
    exported_step = int(run.data.tags["simcse.exported_step"])
    # jobs/evaluate.py's scoring, here (its command line: tests/evaluation/test_retrieval_sets.py).
    from pipeline.evaluation.retrieval_scoring import evaluate_retrieval_model_dir

    (dev,) = evaluate_retrieval_model_dir(tmp_path / "runs/refreshed/model", [str(twitter_like["dev"])])
    assert dev.ndcg_at_10 == pytest.approx(ndcg[exported_step], abs=1e-3)
    assert float(run.data.params["data/unk_share"]) < 0.01


@pytest.mark.job
def test_static_pairs_mine_once_and_the_offline_job_mines_the_same_negatives(
    tmp_path, twitter_like, trained_tiny_model_dir, ray_local, capfd, monkeypatch
):
    # A trained start: a random BERT ranks nearly every candidate inside the positive's margin.
    proc = _train_here(
        tmp_path, twitter_like, trained_tiny_model_dir, "run.name=static", "mining.refresh=once",
        "data.given_negatives=true", capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{2 * TRAIN_GROUPS} with a given negative" in proc.stdout
    client, run = _run(tmp_path, "static")
    run_id = run.info.run_id
    assert [v for _, v in _history(client, run_id, "train/plan_version")] == [1.0, 1.0]
    assert [row["step"] for row in read_refresh_table(client, run_id)] == [0]  # mined once
    folders = [p for p in (tmp_path / "runs/static").glob("checkpoint_*") if p.is_dir()]
    state, _ = load_checkpoint(max(folders, key=lambda p: p.stat().st_mtime))
    negatives = read_negatives(
        state.source
    ).negatives  # the checkpoint names the mined column in the run's storage
    assert state.source.version == 1 and negatives.shape == (2 * TRAIN_GROUPS, 1)

    # jobs/mine.py with the same config, model and pool: the negatives of the training job's
    # mining before epoch 1 (the negatives column above), row for row.
    # In this process, on its Ray (the job as a process of its own: tests/test_cotenancy.py).
    output = tmp_path / "mined.jsonl"
    mined = run_script_in_process(
        "jobs/mine.py",
        ["--config", RECIPE, "--model", str(trained_tiny_model_dir), "--input", str(twitter_like["train"]),
         "--output", str(output), "--set", f"data.pool={twitter_like['pool']}", "--set", "data.pool_format=text",
         "--set", "eval.retrieval=[]", "--set", "data.given_negatives=false"],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert mined.returncode == 0, mined.stderr[-3000:]
    mined_rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert mined_rows and set(mined_rows[0]) == {"anchor", "positive", "negative_1"}
    assert_clean_negatives(mined_rows, 1)
    offline = {(r["anchor"], r["positive"]): r["negative_1"] for r in mined_rows}
    # The column names texts by position in the run's table of distinct texts, which depends
    # only on the set of texts: every text of the pair file (given negatives included) and the pool.
    lines = [line.split("\t") for line in twitter_like["train"].read_text().splitlines()]
    everything = [t for a, b, _ in lines for t in (a, b)] + twitter_like["pool"].read_text().splitlines()
    table, _ = index_triplets(everything, everything, None)
    texts = table.column("text").to_pylist()
    pairs = [(a, b) for a, b, label in lines if label == "1"]
    trained = {
        pair: texts[negative]
        for pair, negative in zip(pairs, negatives[:, 0].tolist(), strict=True)
        if negative >= 0
    }
    # The same miner, weights, seeds and pool: the same negative for every row, and the same
    # rows left without one.
    assert len(trained) >= 0.8 * len(pairs)
    assert offline == trained
    # The pair file's every line is read, label-0 ones included (given_negatives=false ignores them).
    _assert_the_mining_run_is_reviewable(client, mined.stdout, mined_rows, len(lines), tmp_path)
    # No-duplicates batches: the two rows of each headline never share a batch (a random cut
    # of 240 rows into batches of 16 puts about 7 headlines' rows together).
    # The plan is its seed: made again here from the run's resolved config and rows, as every
    # rank's planner task makes it (random batches: the tokens per text do not matter).
    resolved = load_config(tmp_path / "runs/static/resolved_config.yaml")
    distinct, triplets = index_pairs(load_pairs(resolved.data))
    plan, _ = whole_plan(state.source, resolved, np.ones(len(distinct), dtype=np.int32), triplets)
    anchors = np.array([a for a, _ in pairs])
    assert all(len(set(anchors[batch].tolist())) == len(batch) for batch in plan.batches())
    # Rows with hard negatives train on random batches, not length-grouped ones (the unset
    # switch resolved as the run's param says).
    assert run.data.params["train.group_by_length"] == "False"


def test_in_batch_pairs_train_on_length_grouped_batches_by_default(
    tmp_path, twitter_like, trained_tiny_model_dir, ray_local, capfd, monkeypatch
):
    """Pairs without hard negatives (no mining, given negatives off) leave
    ``train.group_by_length`` unset and train on length-grouped batches, rows of one headline
    still apart: the epoch-1 plan an independent tokenization gives, and the run's param says so."""
    from transformers import AutoTokenizer

    from pipeline.batching.same_text import rows_sharing_a_text
    from pipeline.batching.samplers import random_plan
    from pipeline.config.train_section import LENGTH_GROUP_BATCHES

    proc = _train_here(
        tmp_path, twitter_like, trained_tiny_model_dir, "run.name=in-batch", "mining.refresh=never",
        "data.given_negatives=false", "train.epochs=1", "eval.retrieval=[]", capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, run = _run(tmp_path, "in-batch")
    assert run.info.status == "FINISHED" and run.data.params["train.group_by_length"] == "True"
    assert "mining.top_k" not in run.data.params  # no miner ran
    lines = [line.split("\t") for line in twitter_like["train"].read_text().splitlines()]
    pairs = [(a, b) for a, b, label in lines if label == "1"]
    tokenizer = AutoTokenizer.from_pretrained(trained_tiny_model_dir)
    max_len = int(run.data.params["data.max_seq_len"])

    def tokens(text: str) -> int:
        return len(tokenizer(text, truncation=True, max_length=max_len)["input_ids"])

    widths = np.array([max(tokens(a), tokens(b)) for a, b in pairs])
    ids = {text: i for i, text in enumerate(dict.fromkeys(t for pair in pairs for t in pair))}
    texts = np.array([[ids[a], ids[b], -1] for a, b in pairs])
    seed = int(run.data.params["run.seed"])
    grouped = random_plan(
        len(pairs), BATCH, seed=seed, lengths=widths, group_batches=LENGTH_GROUP_BATCHES,
        false_negatives=rows_sharing_a_text(texts),
    )  # fmt: skip
    assert run.data.tags["plan.fingerprint.epoch_1"] == grouped.hex_fingerprint()
    ungrouped = random_plan(len(pairs), BATCH, seed=seed, false_negatives=rows_sharing_a_text(texts))
    assert grouped.hex_fingerprint() != ungrouped.hex_fingerprint()


def _assert_the_mining_run_is_reviewable(
    client: MlflowClient, out: str, rows: list[dict], rows_read: int, download_to: Path
) -> None:
    """The run a reviewer opens: named in the summary, described, with its input as a dataset,
    a similarity histogram and a sample of the rows it wrote."""
    (run,) = client.search_runs([client.get_experiment_by_name("simcse-mining").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["mining/rows_out"] == len(rows)
    assert f"  mlflow run    {run.info.run_id} (experiment 'simcse-mining')" in out
    assert f"{len(rows)} written of {rows_read} pairs" in run.data.tags["mlflow.note.content"]
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.digest == run.data.tags["data.digest"]
    assert {t.value for t in dataset.tags} == {"mining"}
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "review")) == [
        "review/sample_triplets.md",
        "review/similarity.png",
    ]
    sample = Path(client.download_artifacts(run.info.run_id, "review/sample_triplets.md", str(download_to)))
    assert f"| {rows[0]['anchor']} | {rows[0]['positive']} | {rows[0]['negative_1']} |" in sample.read_text()
    assert all(k.startswith("mining/") for k in run.data.metrics)


@pytest.mark.job
def test_a_teacher_scores_denoises_and_is_distilled_and_the_offline_job_writes_its_scores(
    tmp_path, twitter_like, trained_tiny_model_dir, ray_local, capfd, monkeypatch
):
    """``mining.teacher``: the teacher's scores ride beside the negatives (each the teacher's
    own score of that pair, computed here again), no kept negative is within the denoising
    margin of its positive, the refresh logs what the teacher saw, the distillation term
    trains, and ``jobs/mine.py`` writes the scores as sentence-transformers' MarginMSE labels
    and FlagEmbedding's ``pos_scores``/``neg_scores``."""
    from pipeline.model.teacher import Teacher, TeacherSettings

    # The student's relative margin already drops what it scores within 5% of the positive; the
    # teacher (the same weights, read with its folder's pooling) drops more within its wider margin.
    teacher_dir, margin, window = str(trained_tiny_model_dir), 0.2, 8
    teacher_keys = [
        f"mining.teacher.model={teacher_dir}", f"mining.teacher.denoise_margin={margin}",
        "mining.sampling=random", "mining.num_negatives=2", f"mining.range_max={window}",
    ]  # fmt: skip
    proc = _train_here(
        tmp_path, twitter_like, trained_tiny_model_dir, "run.name=taught", "mining.refresh=once", "train.epochs=1",
        "train.distill_weight=1.0", *teacher_keys, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, run = _run(tmp_path, "taught")
    assert run.data.params["train.distill_weight"] == "1.0"
    (row,) = read_refresh_table(client, run.info.run_id)
    assert row["teacher_denoised"] > 0 and row["teacher_positive_score"] > row["teacher_negative_score"]
    # Where the margin cut falls, drawn beside the student's similarity histogram.
    assert {a.path for a in client.list_artifacts(run.info.run_id, "mining")} >= {
        "mining/negative_similarity_v1.png", "mining/teacher_scores_v1.png",
    }  # fmt: skip
    folders = [p for p in (tmp_path / "runs/taught").glob("checkpoint_*") if p.is_dir()]
    state, _ = load_checkpoint(max(folders, key=lambda p: p.stat().st_mtime))
    column = read_negatives(state.source)
    rows = 2 * TRAIN_GROUPS
    assert column.negatives.shape == (rows, window) and column.teacher_scores.shape == (rows, 1 + window)
    present = column.negatives >= 0
    assert present.any(axis=1).mean() > 0.5
    assert np.array_equal(np.isnan(column.teacher_scores[:, 1:]), ~present)
    # Denoised: every negative kept scores below its positive less the margin.
    assert (
        column.teacher_scores[:, 1:][present]
        < np.repeat(column.teacher_scores[:, 0] - margin, present.sum(axis=1))
    ).all()
    # Each score is the teacher's own of that pair.
    lines = [line.split("\t") for line in twitter_like["train"].read_text().splitlines()]
    everything = [t for a, b, _ in lines for t in (a, b)] + twitter_like["pool"].read_text().splitlines()
    table, _ = index_triplets(everything, everything, None)
    texts = table.column("text").to_pylist()
    pairs = [(a, b) for a, b, label in lines if label == "1"]
    teacher = Teacher(TeacherSettings(teacher_dir, max_seq_len=32, batch_size=16), device="cpu")
    sample = np.flatnonzero(present[:, 0])[:20]
    anchors = [pairs[i][0] for i in sample]
    np.testing.assert_allclose(
        column.teacher_scores[sample, 0], teacher.score(anchors, [pairs[i][1] for i in sample]), atol=1e-4
    )
    np.testing.assert_allclose(
        column.teacher_scores[sample, 1],
        teacher.score(anchors, [texts[n] for n in column.negatives[sample, 0]]),
        atol=1e-4,
    )

    output = tmp_path / "taught.jsonl"
    mined = run_script_in_process(
        "jobs/mine.py",
        ["--config", RECIPE, "--model", teacher_dir, "--input", str(twitter_like["train"]), "--output", str(output),
         "--set", f"data.pool={twitter_like['pool']}", "--set", "data.pool_format=text", "--set", "eval.retrieval=[]",
         *set_flags(teacher_keys)],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert mined.returncode == 0, mined.stderr[-3000:]
    mined_rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert mined_rows and set(mined_rows[0]) == {
        "anchor", "positive", "negative_1", "negative_2", "label", "pos_scores", "neg_scores",
    }  # fmt: skip
    assert_clean_negatives(mined_rows, 2)
    some = mined_rows[:10]
    positive = teacher.score([r["anchor"] for r in some], [r["positive"] for r in some])
    first = teacher.score([r["anchor"] for r in some], [r["negative_1"] for r in some])
    np.testing.assert_allclose([r["pos_scores"][0] for r in some], positive, atol=1e-4)
    np.testing.assert_allclose([r["neg_scores"][0] for r in some], first, atol=1e-4)
    np.testing.assert_allclose([r["label"][0] for r in some], positive - first, atol=1e-4)
    assert all(r["neg_scores"][j] < r["pos_scores"][0] - margin for r in mined_rows for j in range(2))
