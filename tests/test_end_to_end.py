"""The training job on a user's own files: a model folder and a jsonl corpus, and the pairs
task on given and mined negatives; a real sqlite MLflow store, real FAISS. The demo as a user
runs it (its own process and local Ray): tests/test_cotenancy.py with tests/demo_checks.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, KillWhenHeld, assert_no_alarming_lines, run_script_in_process
from mlflow.tracking import MlflowClient

from bench.common import set_flags
from pipeline.config.loading import load_config
from pipeline.tracking.refresh_table import read_refresh_table
from pipeline.training.checkpoint import load_checkpoint
from pipeline.training.plan_source import epoch_negatives, read_negatives, whole_plan

pytestmark = pytest.mark.slow

DEMO = str(REPO / "jobs/configs/demo.yaml")


def _client(cwd: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")


def _only_run(client: MlflowClient, experiment: str = "simcse-demo"):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


@pytest.mark.job
def test_model_folder_and_jsonl_corpus(
    tmp_path, tiny_model_dir, paraphrase_corpus, ray_local, capfd, monkeypatch
):
    """`model.name_or_path` = a HF model folder and `data.path` = a jsonl file with a text column;
    evaluated on a retrieval set only (no STS file), which picks the exported model. The job
    runs in this test process on its Ray: what it shows does not depend on the job's own
    process (the demo runs as one: tests/test_cotenancy.py)."""

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
        "train.mlm_weight=0.1",  # SimCSE's auxiliary MLM objective, the reference's weight
        "train.group_by_length=true",
        "mining.batch_sampler=knn",  # a refreshed epoch from the other sampler
        "tracking.experiment=folder",
        f"eval.retrieval={pairs}",
        "train.num_workers=1",  # two ranks: the demo's run; a worker costs ~9 s of CPU to start
    ]
    proc = run_script_in_process(
        "jobs/train.py", ["--config", DEMO, *set_flags(settings)],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch, actor_output=True,
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
    state, extras = load_checkpoint(max((p for p in (tmp_path / "runs/folder").glob("checkpoint_*") if p.is_dir()),
                                   key=lambda p: p.stat().st_mtime))  # fmt: skip
    # The MLM head trained beside the encoder: the checkpoint keeps it (not the shared
    # embeddings), the exported folder leaves it out and loads as a plain encoder.
    assert {"dense.weight", "layer_norm.weight", "bias"} <= set(extras["mlm_head"])
    assert not any(key.startswith("word_embeddings") for key in extras["mlm_head"])
    from transformers import AutoModel

    exported = AutoModel.from_pretrained(tmp_path / "runs/folder/model")
    assert not [name for name, _ in exported.named_parameters() if "mlm" in name or "predictions" in name]
    # The checkpoint keeps where the plan comes from: the knn plan the miner returned, in the run's storage.
    plan, _ = whole_plan(state.source, load_config(None), None, None)
    assert plan.sampler == "knn" and sorted(plan.rows.tolist()) == list(range(len(texts)))
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
    tmp_path, tiny_model_dir, paraphrase_corpus, ray_local, capfd, monkeypatch
):
    """The pairs task on the demo config: given negatives and mined ones (mined with the starting
    weights before epoch 1, refreshed after it), evaluated on STS. The miner is SIGKILLed while
    it mines v2 after epoch 1 (held there by the seam): Ray restarts it from what its calls
    bring (no object-store reference held by the actor), the refresh is submitted again, and
    the job finishes as an uninterrupted one would, with nothing alarming in its output. It runs
    in this process, on its Ray: the seam reaches the miner in its runtime_env."""

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
        "mining.num_negatives=2", "mining.sampling=random", "mining.range_max=3", "mining.random_negatives=1",
        "mining.refresh=every_epoch",
        "train.hard_negative_weight=0.5",
        "train.epochs=2", "train.batch_size=32", "train.lr=1e-3", "tracking.experiment=sup", f"eval.sts={sts}",
        "train.num_workers=1",  # two ranks: the demo's run; a worker costs ~9 s of CPU to start
    ]  # fmt: skip
    killed = KillWhenHeld(monkeypatch, tmp_path / "holds", "miner_refresh=2")
    proc = run_script_in_process(
        "jobs/train.py", ["--config", DEMO, *set_flags(overrides)], cwd=tmp_path, capfd=capfd,
        monkeypatch=monkeypatch, actor_output=True,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    miner_pid = killed.killed_pid()
    assert f"{len(rows)} (anchor, positive) rows" in out and f"{len(rows) // 2} with a given negative" in out
    assert (
        "[mining] the miner actor died during refresh v2" in out and "the miner actor was restarted 1x" in out
    )
    # Nothing alarming but Ray's one report of the process the test killed.
    assert_no_alarming_lines(proc, killed_pids=(miner_pid,))
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
    negatives = read_negatives(state.source).negatives
    assert state.source.version == 2 and negatives.shape == (len(rows), 4)  # 3 mined, 1 random
    assert (negatives[:, :3] >= 0).mean() > 0.5 and (negatives[:, 3] >= 0).all()
    # Each epoch trains with 2 of a row's 3 mined, drawn with its seed, and the random one.
    resolved = load_config(tmp_path / "runs/sup/resolved_config.yaml")
    drawn = epoch_negatives(state.source, resolved).negatives
    assert drawn.shape == (len(rows), 3) and np.array_equal(drawn[:, 2], negatives[:, 3])
    assert all(
        set(d[:2]) - {-1} <= set(n[:3]) for d, n in zip(drawn.tolist(), negatives.tolist(), strict=True)
    )
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
