"""bench.hard_negatives' pure parts: variants per task, the peer's mining options, the report;
for the retrieval task (twitter-url): each arm's overrides and commands, the evaluator's JSON, the
report's numbers and goals, --skip-done, BM25 through the evaluator's metrics, and
bench.st_mnrl_recipe's pair-file reading. Nothing trains and nothing reads ../shared."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import write_beir

import bench.common
import bench.hard_negatives
from bench import st_mnrl_recipe
from pipeline.config.loading import load_config


@pytest.fixture(scope="module")
def hn():
    return bench.hard_negatives


def test_sampler_variants_of_the_unsupervised_tasks(hn):
    assert hn.variant_overrides("cnsd", "peer") is None
    assert hn.variant_overrides("cnsd", "random-norefresh") == ["mining.refresh=never"]
    assert hn.variant_overrides("wiki", "random-mlm") == ["mining.refresh=never", "train.mlm_weight=0.1"]
    assert hn.variant_overrides("wiki", "knn") == ["mining.batch_sampler=knn", "mining.refresh=every_epoch"]
    assert hn.variant_overrides("wiki", "random") == [
        "mining.batch_sampler=random",
        "mining.refresh=every_epoch",
    ]
    assert hn.parse_list(hn.TASKS["cnsd"].variants) == ["random", "knn", "peer"]
    for variant in hn.parse_list(hn.TASKS["cnsd"].variants):
        hn.variant_overrides("cnsd", variant)  # the defaults are all valid


def test_triplet_variants_of_snli(hn):
    assert hn.variant_overrides("snli", "given") == ["mining.refresh=never"]
    assert hn.variant_overrides("snli", "mined") == ["mining.refresh=every_epoch", "mining.num_negatives=1"]
    assert "mining.random_negatives=1" in hn.variant_overrides("snli", "mined+random")
    assert hn.variant_overrides("snli", "peer") is None and hn.variant_overrides("snli", "peer-mined") is None
    assert hn.TASKS["snli"].baseline == "given" and hn.TASKS["snli"].epochs == 2
    for variant in hn.parse_list(hn.TASKS["snli"].variants):
        hn.variant_overrides("snli", variant)


@pytest.mark.parametrize(
    ("task", "variant", "hint"),
    [
        ("snli", "knn", "the corpus task"),
        ("snli", "random", "the corpus task"),
        ("snli", "random-norefresh", "the corpus task"),
        ("snli", "random-mlm", "the corpus task"),
        ("cnsd", "given", "the pairs task"),
        ("wiki", "peer-mined", "the pairs task"),
        ("cnsd", "mined+random", "the pairs task"),
    ],
)
def test_a_variant_of_the_other_mode_is_rejected_saying_why(hn, task, variant, hint):
    with pytest.raises(ValueError, match=hint) as raised:
        hn.variant_overrides(task, variant)
    assert f"task {task}'s" in str(raised.value)


@pytest.mark.parametrize(
    ("task", "variant"), [("snli", "nope"), ("cnsd", "knn+debias"), ("cnsd", "rwr"), ("cnsd", "mixed")]
)
def test_an_unknown_variant_is_rejected_naming_the_known_ones(hn, task, variant):
    with pytest.raises(ValueError, match="unknown|not one of") as raised:
        hn.variant_overrides(task, variant)
    assert "mode" not in str(raised.value)
    assert ("mined+random" if task == "snli" else "random-norefresh") in str(raised.value)


def test_the_peer_mines_with_the_pipelines_settings(hn):
    args = hn.peer_mining_args(load_config(None, ["task=pairs", "data.path=p.jsonl"]))
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert args[0] == "--mine-hard-negatives"
    assert options == {
        "--range-min": "0",  # the pairs task's window start: every known positive is excluded instead
        "--range-max": "64",  # mining.top_k: the candidates searched
        "--relative-margin": "0.05",
        "--num-negatives": "1",
        "--sampling": "top",
    }
    args = hn.peer_mining_args(load_config(None, ["mining.range_max=32", "mining.relative_margin=null"]))
    assert args[args.index("--range-max") + 1] == "32" and args[args.index("--relative-margin") + 1] == "-1.0"
    assert args[args.index("--range-min") + 1] == "10"  # the corpus task's window start


def record(variant, seed, spearman, **extra):
    return {
        "task": "snli", "max_rows": 256, "epochs": 2, "variant": variant, "seed": seed, "rows": 256,
        "spearman": spearman, "mrr_at_10": 50.0, "recall_at_1": 40.0, "steps": 8, "wall_seconds": 100.0,
        **extra,
    }  # fmt: skip


def test_the_snli_report_compares_with_given_and_counts_mined_negatives(hn):
    records = [
        record("peer-mined", 1, 81.0, mined_anchors=250, rows=250),
        record("mined", 1, 82.0, mining={"mining/selected": 240.0}),
        record("mined", 2, 84.0, mining={"mining/selected": 244.0}),
        record("given", 1, 80.0, mining={}),
        record("given", 2, 81.0, mining={}),
        record("peer", 1, 79.0),
    ]
    text = hn.report(records)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| variant"))
    assert "Δ given" in header and "| mined |" in header and "Δ random" not in header
    rows = [line for line in lines if line.startswith("| ") and line != header]
    assert [row.split(" | ")[0][2:] for row in rows] == ["given", "mined", "peer", "peer-mined"]
    given, mined, peer, peer_mined = (row.split(" | ") for row in rows)
    assert given[2] == "80.50 ± 0.71" and given[3] == "" and given[-3] == ""
    assert mined[2] == "83.00 ± 1.41" and mined[-3] == "242"
    assert mined[3] == "+2.50 ± 0.71 (outside spread, 2 seeds)"  # paired: +2 at seed 1, +3 at seed 2
    assert peer[3] == "-1.50 (1 seed)" and peer_mined[-3] == "250"
    assert "(250, 256 trained)" in text


def test_the_sampler_report_keeps_random_as_its_baseline(hn):
    records = [
        {**record("knn", 1, 50.0), "task": "cnsd"},
        {**record("random", 1, 49.0), "task": "cnsd"},
        {**record("random-norefresh", 1, 48.0), "task": "cnsd"},
        {**record("peer", 1, 47.0), "task": "cnsd"},
    ]
    records[0]["mining"] = {"mining/batch_similarity_mean": 0.25}
    records[1]["mining"] = {"mining/batch_similarity_mean": 0.0625}
    lines = hn.report(records).splitlines()
    header = next(line for line in lines if line.startswith("| variant"))
    assert "Δ random" in header and "mined" not in header and "| batch sim |" in header
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and line != header]
    assert [row[0][2:] for row in rows] == ["random", "random-norefresh", "knn", "peer"]
    similarity = {row[0][2:]: row[-3] for row in rows}
    assert similarity == {"random": "0.062", "random-norefresh": "", "knn": "0.250", "peer": ""}


def test_pipeline_variants_are_compared_seed_by_seed_and_the_peer_by_means(hn):
    """At the same seed a variant trains the baseline's first epoch: the per-seed differences
    are what the refreshed epochs did, without the spread the seed gives every variant alike."""
    records = [
        {**record("random", 1, 50.0), "task": "cnsd"},
        {**record("random", 2, 53.0), "task": "cnsd"},
        {**record("knn", 1, 50.5), "task": "cnsd"},
        {**record("knn", 2, 53.4), "task": "cnsd"},
        {**record("knn", 3, 60.0), "task": "cnsd"},  # no baseline at seed 3: left out of Δ
        {**record("peer", 1, 50.5), "task": "cnsd"},
        {**record("peer", 2, 53.4), "task": "cnsd"},
    ]
    lines = hn.report(records).splitlines()
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}
    assert rows["knn"][3] == "+0.45 ± 0.07 (outside spread, 2 seeds)"
    # The same scores from the peer, its own trainer: only the means compare, within 2.1 + 2.1.
    assert rows["peer"][3] == "+0.45 (within spread)"
    assert hn.paired_difference({3: 1.0}, {1: 0.0}) == "n/a"
    assert hn.paired_difference({1: 1.0, 2: 7.0}, {1: 0.0, 2: 0.0}) == "+4.00 ± 4.24 (within spread, 2 seeds)"


def test_the_peers_mining_joins_each_mined_negative_to_its_own_row(
    tmp_path, trained_tiny_model_dir, paraphrase_pairs
):
    """``bench.st_mnrl_recipe --mine-hard-negatives``: sentence-transformers returns its rows
    reordered; each kept row must get the negative mined for its own (anchor, positive), one
    that passes the relative margin against that pair under the same model."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    anchors, positives = paraphrase_pairs
    rows = {
        "anchor": list(anchors),
        "positive": list(positives),
        "negative": [f"given {i}" for i in range(len(anchors))],
    }
    settings = st_mnrl_recipe.PeerMining(range_min=2, range_max=16, relative_margin=0.05, num_negatives=1)
    mined, report = st_mnrl_recipe.mine_negatives(
        trained_tiny_model_dir, rows, settings, max_seq_len=32, seed=0
    )

    kept = len(mined["anchor"])
    assert report["mined_anchors"] == kept and report["mining_rows_in"] == len(anchors) and kept > 0
    assert list(mined) == ["anchor", "positive", "negative", "mined_negative_1"]
    order = [rows["anchor"].index(a) for a in mined["anchor"]]
    assert order == sorted(order)  # the rows' own order, the dropped ones left out
    assert mined["negative"] == [rows["negative"][i] for i in order]  # the given column travels along
    model = SentenceTransformer(str(trained_tiny_model_dir), device="cpu")
    model.max_seq_length = 32

    def cosine(a, b):
        ea, eb = (model.encode(x, normalize_embeddings=True) for x in (a, b))
        return (ea * eb).sum(axis=1)

    positive_sim = cosine(mined["anchor"], mined["positive"])
    negative_sim = cosine(mined["anchor"], mined["mined_negative_1"])
    assert (negative_sim <= positive_sim * 0.95 + 1e-4).all()
    assert set(mined["mined_negative_1"]) <= set(positives)
    assert not any(
        n in (a, p)
        for a, p, n in zip(mined["anchor"], mined["positive"], mined["mined_negative_1"], strict=True)
    )
    assert np.isfinite(report["mining_seconds"])


# --- task twitter-url (retrieval) ----------------------------------------------------------


def test_each_retrieval_arm_trains_the_recipe_with_its_overrides_and_no_in_training_eval(hn):
    no_eval = ["eval.retrieval=[]", "eval.sts=[]"]
    assert hn.variant_overrides("twitter-url", "A") == [
        "mining.refresh=never", "data.given_negatives=false", "train.group_by_length=false", *no_eval
    ]  # fmt: skip
    assert hn.variant_overrides("twitter-url", "G") == [
        "mining.refresh=never", "data.given_negatives=true", *no_eval
    ]  # fmt: skip
    static, refreshed, unfiltered = (hn.variant_overrides("twitter-url", arm) for arm in "SCU")
    assert "mining.refresh=once" in static and "data.given_negatives=false" in static
    assert "mining.refresh=every_epoch" in refreshed and "data.given_negatives=false" in refreshed
    assert unfiltered == [
        *refreshed[: -len(no_eval)],
        "mining.relative_margin=null", "mining.range_min=0", "mining.max_score=null", *no_eval,
    ]  # fmt: skip
    for arm in ("st", "st-mined", "start", "bm25"):
        assert hn.variant_overrides("twitter-url", arm) is None
    assert hn.parse_list(hn.TASKS["twitter-url"].variants) == [
        "start", "bm25", "A", "G", "S", "C", "U", "GS", "AL", "SL", "CL", "SE", "S3", "S3R", "S7", "S7R", "SH", "SG",
        "TD", "TK", "TDK", "TK7", "CTDK", "TKT", "st", "st-mined", "st-mined3", "st-mined7", "st-teacher-d", "st-teacher-k", "st-teacher-dk", "st-given",
        "st-mined-h", "st-mined-gte",
    ]  # fmt: skip
    assert hn.st_mined(3)[hn.st_mined(3).index("--num-negatives") + 1] == "3"
    with pytest.raises(ValueError, match="not one of task twitter-url's: start,bm25,A"):
        hn.variant_overrides("twitter-url", "knn")
    with pytest.raises(ValueError, match="not one of task snli's"):
        hn.variant_overrides("snli", "C")


def test_the_retrieval_arms_overrides_are_valid_settings_of_a_pair_mode_config(hn, tmp_path):
    """Each arm's ``--set`` list loads (keys, types, the checks between them) on a pair-mode
    config like the recipe's, and does what its name says."""
    from pipeline.config.loading import load_config

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a headline\ta tweet\t1\na headline\tanother tweet\t0\n", encoding="utf-8")
    base = [f"data.path={pairs}", "data.format=pairs_tsv", "task=pairs"]
    configs = {
        arm: load_config(None, base + hn.variant_overrides("twitter-url", arm)) for arm in hn.RETRIEVAL_ARMS
    }
    assert {arm: c.mining.refresh for arm, c in configs.items()} == {
        "A": "never", "G": "never", "S": "once", "C": "every_epoch", "U": "every_epoch", "GS": "once",
        "AL": "never", "SL": "once", "CL": "every_epoch", "SE": "once",
        "S3": "once", "S3R": "once", "S7": "once", "S7R": "once", "SH": "once", "SG": "once", "TD": "once", "TK": "once", "TDK": "once",
        "TK7": "once", "CTDK": "every_epoch", "TKT": "once", "TKx": "once",
    }  # fmt: skip
    # The teacher arms: S with the teacher's denoising (TD), its distillation (TK), or both;
    # TK7 distils over 7 negatives, CTDK is TDK refreshed, TKT reads the teacher softer.
    assert {
        arm: (c.mining.teacher.model, c.mining.teacher.denoise_margin, c.train.distill_weight)
        for arm, c in configs.items()
        if c.mining.teacher.model
    } == {
        "TD": (hn.TEACHER, hn.TEACHER_MARGIN, 0.0), "TK": (hn.TEACHER, None, 1.0),
        "TDK": (hn.TEACHER, hn.TEACHER_MARGIN, 1.0), "TK7": (hn.TEACHER, None, 1.0),
        "CTDK": (hn.TEACHER, hn.TEACHER_MARGIN, 1.0), "TKT": (hn.TEACHER, None, 1.0),
        "TKx": (hn.CROSS_FIT_TEACHER, None, 1.0),
    }  # fmt: skip
    assert configs["TK7"].mining.num_negatives == 7
    assert {arm: c.mining.teacher.temperature for arm, c in configs.items() if c.mining.teacher.model} == {
        "TD": None, "TK": None, "TDK": None, "TK7": None, "CTDK": None, "TKT": hn.SOFT_TEACHER_TEMPERATURE,
        "TKx": None,
    }  # fmt: skip
    # TKx is TK with the cross-fitted teacher, and only on the fold it never saw: not a default arm.
    assert hn.variant_overrides("twitter-url", "TKx") == [
        *hn.variant_overrides("twitter-url", "TK")[:2], f"mining.teacher.model={hn.CROSS_FIT_TEACHER}",
        *hn.variant_overrides("twitter-url", "TK")[3:],
    ]  # fmt: skip
    assert "TKx" not in hn.parse_list(hn.TASKS["twitter-url"].variants)
    # The k ablation: k negatives an epoch; the R arms draw them anew from the window's survivors.
    assert {arm: (c.mining.num_negatives, c.negatives_mined) for arm, c in configs.items() if arm[1:2].isdigit()} == {
        "S3": (3, 3), "S3R": (3, hn.NEGATIVE_WINDOW), "S7": (7, 7), "S7R": (7, hn.NEGATIVE_WINDOW),
    }  # fmt: skip
    assert [arm for arm, c in configs.items() if c.train.group_by_length] == ["AL", "SL", "CL"]
    # SH is S with its negative hardness-weighted, and the only arm that weights them.
    assert {arm: c.train.hardness_strength for arm, c in configs.items() if c.train.hardness_strength} == {
        "SH": hn.HARDNESS_STRENGTH
    }
    assert hn.variant_overrides("twitter-url", "SH")[:-2] == [
        *hn.variant_overrides("twitter-url", "S")[:-2],
        f"train.hardness_strength={hn.HARDNESS_STRENGTH}",
    ]
    # SG is S with GTE's four-term loss, and the only arm that changes the loss's terms.
    assert {
        arm: c.train.directions for arm, c in configs.items() if c.train.directions != ["query_to_doc"]
    } == {"SG": hn.GTE_DIRECTIONS.split(",")}
    assert hn.variant_overrides("twitter-url", "SG")[:-2] == [
        *hn.variant_overrides("twitter-url", "S")[:-2], f"train.directions=[{hn.GTE_DIRECTIONS}]",
    ]  # fmt: skip
    # A is the ungrouped in-batch arm of the earlier records; unset, such rows are grouped (AL).
    assert configs["A"].train.group_by_length is False
    assert [arm for arm, c in configs.items() if c.data.given_negatives] == ["G", "GS"]
    # Every arm but SE evaluates nothing while it trains; SE keeps the recipe's sets and stops early.
    assert [arm for arm, c in configs.items() if c.eval.patience] == ["SE"]
    assert [arm for arm, overrides in ((a, hn.variant_overrides("twitter-url", a)) for a in configs)
            if "eval.retrieval=[]" not in overrides] == ["SE"]  # fmt: skip
    assert configs["C"].mining.relative_margin == 0.05 and configs["U"].mining.relative_margin is None
    assert configs["U"].mining.range_min == 0 and configs["U"].mining.max_score is None


def retrieval_task(hn, tmp_path):
    return hn.Task(
        name="twitter-url", config="jobs/configs/recipe-twitter-url.yaml", max_rows=None, epochs=3,
        data_path=str(tmp_path / "train.tsv"), model=str(tmp_path / "minilm"), sts=None, lr=5e-5,
        batch_size=64, max_seq_len=32, tracking_uri=f"sqlite:///{tmp_path}/mlruns.db", experiment="bench",
        dev=str(tmp_path / "dev"), warmup_ratio=0.1,
    )  # fmt: skip


def test_a_runs_facts_come_from_its_mlflow_run_precision_included(hn, tmp_path):
    """What a result line says besides its scores is read from the run as the job logged it
    (a real sqlite store): rows, the exported step, the epochs' and refreshes' seconds summed,
    and the forward passes' precision, which differs between machines with and without bf16."""
    from mlflow.tracking import MlflowClient

    task = retrieval_task(hn, tmp_path)
    client = MlflowClient(tracking_uri=task.tracking_uri)
    run_id = client.create_run(client.create_experiment("bench")).info.run_id
    client.log_param(run_id, "data/rows", "7710")
    client.set_tag(run_id, "simcse.exported_step", "363")
    client.set_tag(run_id, "simcse.forward_dtype", "fp32")
    for step, seconds in enumerate((600.0, 550.5, 549.5)):
        client.log_metric(run_id, "train/epoch_seconds", seconds, step=step)
    client.log_metric(run_id, "mining/total_s", 240.0)
    client.set_terminated(run_id)
    facts = hn.run_facts(task, client.get_run(run_id))
    assert facts["rows"] == 7710 and facts["steps"] == 363 and facts["forward_dtype"] == "fp32"
    assert facts["train_seconds"] == 1700.0 and facts["mining_seconds"] == 240.0
    assert facts["mining"] == {"mining/total_s": 240.0} and facts["mlflow_run_id"] == run_id


def evaluator_json(ndcg, **extra):
    """``jobs/evaluate.py --retrieval DEV --json``'s object for one BEIR set."""
    scores = {
        "ndcg_at_10": ndcg,
        "mrr_at_10": 92.0,
        "recall_at_1": 85.0,
        "recall_at_10": 96.0,
        "recall_at_100": 99.5,
    }
    return json.dumps(
        {
            **extra,
            "retrieval": [
                {"name": "dev", "path": "dev", "queries": 400, "skipped": 0, "corpus": 3951, **scores}
            ],
        }
    )


def test_the_evaluators_json_gives_the_retrieval_scores_not_the_sts_ones(hn):
    output = "[eval] encoding 4351 texts\n" + evaluator_json(90.7)
    assert hn.retrieval_scores(output) == {
        "ndcg_at_10": 90.7, "mrr_at_10": 92.0, "recall_at_1": 85.0, "recall_at_10": 96.0, "recall_at_100": 99.5
    }  # fmt: skip
    # With STS files too, the top level has STS's own mrr_at_10 and recall_at_1: not these.
    both = evaluator_json(91.0, spearman=86.7, mrr_at_10=40.0, recall_at_1=30.0, files=[])
    assert hn.retrieval_scores(both)["mrr_at_10"] == 92.0
    no_ndcg = json.dumps({"retrieval": [{"name": "dev", "mrr_at_10": 1.0, "ndcg_at_10": None}]})
    with pytest.raises(RuntimeError, match="printed no ndcg_at_10, recall_at_1, recall_at_10, recall_at_100"):
        hn.retrieval_scores(no_ndcg)  # a NaN score is printed as null
    with pytest.raises(RuntimeError, match="printed no JSON line"):
        hn.retrieval_scores("error: retrieval set not found: dev")


def test_the_peers_train_on_the_recipes_settings_and_are_scored_by_the_evaluator(hn, tmp_path, monkeypatch):
    task = retrieval_task(hn, tmp_path)
    calls = []

    def fake_run_logged(cmd, log):
        calls.append(cmd)
        if cmd[1:3] == ["-m", "bench.st_mnrl_recipe"]:
            out = cmd[cmd.index("--out") + 1]
            line = {"steps": 306, "rows": 6500, "train_seconds": 600.0, "mined_anchors": 6500,
                    "mining_rows_in": 7710, "mining_seconds": 113.0, "model_dir": f"{out}/model"}  # fmt: skip
            return 0, 700.04, "training...\n" + json.dumps(line)
        return 0, 20.0, evaluator_json(91.4)

    monkeypatch.setattr(hn, "run_logged", fake_run_logged)
    record = hn.run_retrieval_arm(task, "st-mined", 2, keep_dir=True)
    train, evaluate = calls
    options = dict(zip(train[3::2], train[4::2], strict=False))
    assert options["--seed"] == "2" and options["--warmup-ratio"] == "0.1" and options["--lr"] == "5e-05"
    assert options["--batch-size"] == "64" and options["--max-seq-len"] == "32" and options["--epochs"] == "3"
    assert "--no-duplicates" in train and "--sts" not in train
    mining = train[train.index("--mine-hard-negatives") :]
    assert dict(zip(mining[1::2], mining[2::2], strict=True)) == {
        "--mining-corpus": "all-rows", "--num-negatives": "1", "--relative-margin": "0.05",
        "--sampling": "top", "--range-min": "0", "--range-max": "-1",  # sentence-transformers derives it
    }  # fmt: skip
    model_dir = str(hn.BENCH_DIR / "twitter-url" / "hn-twitter-url-st-mined-rall-e3-s2" / "model")
    assert evaluate[1:] == [
        "jobs/evaluate.py", "--model", model_dir, "--retrieval", task.dev, "--max-seq-len", "32", "--json"
    ]  # fmt: skip
    assert record["ndcg_at_10"] == 91.4 and record["wall_seconds"] == 700.0 and record["eval_seconds"] == 20.0
    assert record["mining_seconds"] == 113.0 and record["mined_anchors"] == 6500 and record["rows"] == 6500

    calls.clear()
    record = hn.run_retrieval_arm(task, "st", 1, keep_dir=True)
    assert "--no-duplicates" in calls[0] and "--mine-hard-negatives" not in calls[0]
    assert "--given-negatives" not in calls[0]
    calls.clear()
    hn.run_retrieval_arm(task, "st-given", 1, keep_dir=True)
    assert "--given-negatives" in calls[0] and "--mine-hard-negatives" not in calls[0]
    calls.clear()
    record = hn.run_retrieval_arm(task, "start", None, keep_dir=True)
    assert [c[1] for c in calls] == ["jobs/evaluate.py"] and calls[0][
        calls[0].index("--model") + 1
    ] == task.model
    assert record["steps"] == 0 and record["wall_seconds"] is None and record["ndcg_at_10"] == 91.4


def test_a_train_file_given_trains_every_arm_on_it_and_keeps_its_runs_and_lines_apart(
    hn, tmp_path, monkeypatch
):
    """``--data-path``: the recipe's config with that train file, the pipeline's ``data.path``
    and the peer's ``--train`` both it, run names of their own, and results lines that
    ``--skip-done`` keeps apart from the recipe's rows."""
    fold = tmp_path / "folds" / "fold1.tsv"
    fold.parent.mkdir()
    fold.write_text("a headline\ta tweet\t1\n", encoding="utf-8")
    common = {
        "max_rows": None,
        "epochs": None,
        "model": str(tmp_path / "minilm"),
        "dev": str(tmp_path / "dev"),
    }
    recipe = hn.resolve_task("twitter-url", **common)
    given = hn.resolve_task("twitter-url", **common, data_path=str(fold))
    assert given.data_given and given.data_path == str(fold)
    assert not recipe.data_given and recipe.data_path == str(load_config(hn.REPO / recipe.config).data.path)
    assert (given.lr, given.batch_size, given.epochs) == (recipe.lr, recipe.batch_size, recipe.epochs)
    assert hn.run_name(given, "TKx", 2) == hn.run_name(recipe, "TKx", 2) + "-dfold1"

    task = dataclasses.replace(retrieval_task(hn, tmp_path), data_path=str(fold), data_given=True)
    commands = []

    def fake_run_logged(cmd, log):
        commands.append(cmd)
        return 0, 1.0, ""

    monkeypatch.setattr(hn, "run_logged", fake_run_logged)
    monkeypatch.setattr(hn, "finished_run", lambda task_, name: "run" if commands else None)
    hn.train_pipeline(task, "TKx", 2, hn.variant_overrides("twitter-url", "TKx"))
    (train,) = commands
    sets = [train[i + 1] for i, flag in enumerate(train) if flag == "--set"]
    assert f"data.path={fold}" in sets and f"mining.teacher.model={hn.CROSS_FIT_TEACHER}" in sets
    assert "run.name=hn-twitter-url-TKx-rall-e3-s2-dfold1" in sets
    peer = hn.peer_command(task, 2, tmp_path / "peer")
    assert peer[peer.index("--train") + 1] == str(fold)

    # The grid: a line of the recipe's rows does not count as done for the fold's, whose lines say so.
    ran = []
    monkeypatch.setattr(hn, "resolve_task", lambda *args, **kwargs: task)
    monkeypatch.setattr(hn, "missing_inputs", lambda task_: None)
    monkeypatch.setattr(hn, "run_retrieval_arm", lambda task_, arm, seed, keep: ran.append((arm, seed)) or {
        "run_name": hn.run_name(task_, arm, seed), "steps": 180, **dict.fromkeys(hn.RETRIEVAL_SCORES, 82.0)
    })  # fmt: skip
    results = tmp_path / "results.jsonl"
    write_results(results, [retrieval_record("TK", 1, 82.0)])
    argv = ["--task", "twitter-url", "--arms", "TK", "--seeds", "1", "--results", str(results), "--skip-done"]
    assert hn.main([*argv, "--data-path", str(fold)]) == 0 and ran == [("TK", 1)]
    line = json.loads(results.read_text().splitlines()[-1])
    assert line["data_path"] == str(fold) and line["run_name"].endswith("-dfold1")
    assert hn.main([*argv, "--data-path", str(fold)]) == 0 and ran == [("TK", 1)]  # now done

    # The report keeps the two files' rows apart, each compared with the baseline asked for.
    write_results(results, [
        retrieval_record("TK", 1, 82.0), retrieval_record("S", 1, 81.0),
        retrieval_record("TK", 1, 82.5, data_path=str(fold)), retrieval_record("S", 1, 82.0, data_path=str(fold)),
    ])  # fmt: skip
    parts = {p.split("\n")[0]: p for p in hn.report(hn.read_results(results), baseline="S").split("### ")[1:]}
    recipe_part = parts.pop("twitter-url: all rows, 3 epochs")
    fold_part = parts.pop(f"twitter-url: all rows of {fold}, 3 epochs")
    assert not parts and "Δ S" in recipe_part
    assert "| TK | 1 | 82.00 | +1.00" in recipe_part and "| TK | 1 | 82.50 | +0.50" in fold_part


def retrieval_record(arm, seed, ndcg, r10=96.0, wall=600.0, **extra):
    return {
        "task": "twitter-url", "max_rows": None, "epochs": 3, "variant": arm, "seed": seed, "rows": 7710,
        "steps": 363, "ndcg_at_10": ndcg, "mrr_at_10": ndcg + 1, "recall_at_1": ndcg - 10, "recall_at_10": r10,
        "recall_at_100": 99.0, "wall_seconds": wall, **extra,
    }  # fmt: skip


def write_results(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_the_retrieval_report_table_deltas_and_goals(hn, tmp_path, capsys):
    a = [90.0, 90.5, 91.0]
    s = [90.5, 91.2, 91.6]  # S - A: +0.5, +0.7, +0.6
    c = [90.6, 91.6, 91.4]  # C - S: +0.1, +0.4, -0.2
    records = [
        retrieval_record("start", None, 90.7, wall=None),
        retrieval_record("bm25", None, 70.0, wall=3.0),
    ]
    for i, seed in enumerate((1, 2, 3)):
        records += [
            retrieval_record("A", seed, a[i], r10=96.0),
            retrieval_record("S", seed, s[i], mining_seconds=30.0),
            retrieval_record("C", seed, c[i], r10=95.9, wall=700.0, mining_seconds=90.0),
            retrieval_record("U", seed, c[i] - 0.3, wall=700.0),
            retrieval_record("st-mined", seed, 90.4 + i / 10, wall=500.0, rows=6500, mining_seconds=113.0),
        ]
    write_results(tmp_path / "r.jsonl", records)
    assert hn.main(["--report", "--task", "twitter-url", "--results", str(tmp_path / "r.jsonl")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| arm"))
    assert header.split(" | ")[1:] == [
        "n", "nDCG@10", "Δ A", "MRR@10", "Δ A", "R@1", "Δ A", "R@10", "Δ A", "rows", "steps", "mining s", "wall s |"
    ]  # fmt: skip
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ")
        for line in lines
        if line.startswith("| ") and line != header
    }
    assert list(rows) == ["start", "bm25", "A", "S", "C", "U", "st-mined"]
    assert rows["A"][1:4] == ["3", "90.50 ± 0.50", ""]
    assert rows["S"][2:4] == ["91.10 ± 0.56", "+0.60 ± 0.10 (outside spread, 3 seeds)"]  # paired
    assert (
        rows["C"][3] == "+0.70 ± 0.36 (outside spread, 3 seeds)"
        and rows["C"][9] == "-0.10 ± 0.00 (outside spread, 3 seeds)"
    )
    assert rows["st-mined"][3] == "+0.00 (within spread)"  # by means: 90.5 against 90.5
    assert rows["start"][1:4] == ["1", "90.70", "+0.20 (within spread)"]  # no spread of its own, A's 0.5
    assert rows["bm25"][3] == "-20.50 (outside spread)"
    assert rows["st-mined"][-4:] == ["6500", "363", "113", "500 |"] and rows["start"][-1] == " |"
    goals = [line for line in lines if line.startswith("- ")]
    assert len(goals) == len(hn.GOALS) == 6
    s_over_a, c_over_s, c_vs_peer, u_below_c, r10, wall = goals
    assert s_over_a.startswith(
        "- **met**: S > A by more than the spread: Δ nDCG@10 S - A +0.60 ± 0.10 over 3 seed(s)"
    )
    assert "(per seed: s1 +0.50, s2 +0.70, s3 +0.60), 0.50 beyond the spread" in s_over_a
    assert c_over_s.startswith("- **not met**: C > S") and c_over_s.endswith(
        "+0.10 ± 0.30 over 3 seed(s) (per seed: s1 +0.10, s2 +0.40, s3 -0.20), 0.20 short of the spread"
    )
    assert c_vs_peer.startswith(
        "- **met**: C >= st-mined + 0.5 nDCG@10: nDCG@10 C 91.20 - st-mined 90.50 = +0.70, 0.20 above the +0.5 target"
    )
    assert "per seed C: s1 90.60, s2 91.60, s3 91.40; st-mined: s1 90.40, s2 90.50, s3 90.60" in c_vs_peer
    assert u_below_c.startswith("- **met**: U < C: Δ nDCG@10 C - U +0.30") and u_below_c.endswith("by +0.30")
    assert r10.startswith("- **not met**: R@10 of C not below A's: Δ R@10 C - A -0.10") and r10.endswith(
        "by -0.10"
    )
    assert wall.startswith(
        "- **not met**: C's wall time <= 1.3x st-mined's: C 700 s / st-mined 500 s = 1.40x, 0.10x over the 1.3x limit"
    )
    assert "per seed C: s1 700, s2 700, s3 700" in wall


def test_a_goal_without_its_arms_or_with_one_seed_says_so(hn):
    by_arm = {"A": [retrieval_record("A", 1, 90.0)], "S": [retrieval_record("S", 1, 91.0)]}
    assert hn.goal_line(hn.GOALS[0], by_arm).startswith(
        "- n/a: S > A by more than the spread: Δ nDCG@10 S - A +1.00 over 1 seed(s)"
    )
    assert hn.goal_line(hn.GOALS[1], by_arm) == "- n/a: C > S by more than the spread (no C results yet)"
    assert (
        hn.goal_line(hn.GOALS[2], by_arm)
        == "- n/a: C >= st-mined + 0.5 nDCG@10 (no C and st-mined results yet)"
    )
    by_arm["U"] = [retrieval_record("U", 2, 90.0)]
    by_arm["C"] = [retrieval_record("C", 1, 90.0)]
    assert hn.goal_line(hn.GOALS[3], by_arm) == "- n/a: U < C (no seed with both C and U)"


def test_the_grid_skips_what_is_done_and_runs_start_and_bm25_once(hn, tmp_path, monkeypatch, capsys):
    task = retrieval_task(hn, tmp_path)
    ran = []

    def fake_arm(task_, arm, seed, keep_dir):
        ran.append((arm, seed))
        return {"run_name": None, "wall_seconds": 1.0, "steps": 0, "rows": 0,
                **dict.fromkeys(hn.RETRIEVAL_SCORES, 50.0)}  # fmt: skip

    monkeypatch.setattr(hn, "resolve_task", lambda *args, **kwargs: task)
    monkeypatch.setattr(hn, "missing_inputs", lambda task_: None)
    monkeypatch.setattr(hn, "run_retrieval_arm", fake_arm)
    results = tmp_path / "results.jsonl"
    write_results(results, [retrieval_record("A", 1, 90.0)])
    argv = [
        "--task",
        "twitter-url",
        "--arms",
        "start,A,st",
        "--seeds",
        "1,2",
        "--results",
        str(results),
        "--skip-done",
    ]
    assert hn.main(argv) == 0
    assert ran == [("start", None), ("st", 1), ("A", 2), ("st", 2)]
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["variant"], r["seed"], r["epochs"]) for r in lines[1:]] == [
        ("start", None, 3), ("st", 1, 3), ("A", 2, 3), ("st", 2, 3)
    ]  # fmt: skip
    assert "[skip] twitter-url A seed 1" in capsys.readouterr().out
    ran.clear()
    assert hn.main(argv) == 0 and ran == []  # resumed: all done
    assert hn.main(argv[:-1]) == 0 and len(ran) == 5  # without --skip-done: all again


def test_a_run_folder_kept_by_another_experiment_is_cleared_and_an_interrupted_one_kept(
    hn, tmp_path, monkeypatch
):
    """A folder left by ``--keep-run-dirs`` in another experiment would be resumed by the job
    (its last checkpoint exported, nothing trained); this experiment's interrupted run resumes."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.run import RUN_NAME_TAG, STATE_TAG

    task = retrieval_task(hn, tmp_path)
    monkeypatch.setattr(hn, "BENCH_DIR", tmp_path / "runs")
    kept, interrupted = "hn-twitter-url-C-rall-e3-s2", "hn-twitter-url-C-rall-e3-s3"
    for name in (kept, interrupted):
        (tmp_path / "runs/twitter-url" / name / "checkpoint_000001").mkdir(parents=True)
    client = MlflowClient(tracking_uri=task.tracking_uri)
    other = client.create_experiment("an-earlier-bench")
    client.create_run(other, tags={RUN_NAME_TAG: kept, STATE_TAG: "finished"})
    ours = client.create_experiment(task.experiment)
    client.create_run(ours, tags={RUN_NAME_TAG: interrupted, STATE_TAG: "running"})

    assert hn.clear_other_experiments_folder(task, kept)
    assert not (tmp_path / "runs/twitter-url" / kept).exists()
    assert not hn.clear_other_experiments_folder(task, interrupted)
    assert (tmp_path / "runs/twitter-url" / interrupted / "checkpoint_000001").is_dir()
    assert hn.finished_run(task, interrupted) is None  # not finished: trained (resumed) again
    assert not hn.clear_other_experiments_folder(task, "no-folder")


def test_the_grid_default_results_file_is_the_tasks_own(hn):
    assert hn.results_path("twitter-url") == "bench/results/twitter-url.jsonl"
    assert hn.results_path("cnsd") == "bench/results/results.jsonl"


def test_bm25_is_scored_by_the_evaluators_ranking_metrics(hn, tmp_path):
    """A query whose own text is in the corpus does not find itself, and a relevant document
    BM25 ranks second counts 1/2 in MRR@10 and 1/log2(3) in nDCG@10."""
    pytest.importorskip("bm25s")
    queries = {"q0": "red apple pie recipe", "q1": "stock market crash", "q2": "sunny weather forecast"}
    docs = {"d0": "apple pie with red apples recipe", "d1": "market stocks crash today",
            "d2": "weather sunny", "d3": "stock market crash", "d4": "forecast rain"}  # fmt: skip
    dev = write_beir(tmp_path / "dev", queries, docs, [("q0", "d0", 1), ("q1", "d1", 1), ("q2", "d4", 1)])
    task = dataclasses.replace(retrieval_task(hn, tmp_path), dev=str(dev))
    record = hn.bm25_scores(task)
    assert record["recall_at_1"] == pytest.approx(200 / 3)
    assert record["mrr_at_10"] == pytest.approx(100 * (1 + 1 + 0.5) / 3)
    assert record["ndcg_at_10"] == pytest.approx(100 * (2 + 1 / math.log2(3)) / 3)
    assert record["recall_at_10"] == pytest.approx(100.0) and record["steps"] == 0


def test_the_peer_given_the_files_negatives_deals_them_as_the_pipeline_does(tmp_path):
    """``--given-negatives``: the j-th row of an anchor gets the (j mod n)-th of its n label-0
    texts, in file order, never one of its own positives; rows of an anchor with none are left
    out after ``--max-rows`` picked the rows, as ``G`` trains the same rows in-batch only."""
    path = tmp_path / "train.tsv"
    path.write_text(
        "a\tp1\t1\na\tn1\t0\na\tp2\t1\na\tn2\t0\na\tp3\t1\n"
        "a\tp1\t0\n"  # a label-0 text that is one of a's positives: not its negative
        "b\tq\t1\nc\tr\t1\nc\tn1\t0\n",
        encoding="utf-8",
    )
    assert st_mnrl_recipe.training_rows(str(path), None, given_negatives=True) == {
        "anchor": ["a", "a", "a", "c"], "positive": ["p1", "p2", "p3", "r"], "negative": ["n1", "n2", "n1", "n1"],
    }  # fmt: skip
    assert st_mnrl_recipe.training_rows(str(path), 4, given_negatives=True)["positive"] == ["p1", "p2", "p3"]
    assert "negative" not in st_mnrl_recipe.training_rows(str(path), None)


def test_the_peer_reads_a_headerless_pair_file_as_it_is(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text(
        'obama says " no " \t obama : " no "\t1\n'
        "obama says no\tweather today\t0\n"
        "second headline\tits tweet\t1\n"
        "\tan empty anchor\t1\n"
        "second headline\tweather today\t0\n",
        encoding="utf-8",
    )
    rows = st_mnrl_recipe.training_rows(str(path), None)
    assert rows == {
        "anchor": ['obama says " no "', "second headline"],
        "positive": ['obama : " no "', "its tweet"],
    }
    assert st_mnrl_recipe.training_rows(str(path), 1)["anchor"] == ['obama says " no "']
    assert st_mnrl_recipe.mining_corpus(st_mnrl_recipe.ALL_ROWS, str(path)) == [
        'obama : " no "',
        "weather today",
        "its tweet",
        "an empty anchor",
    ]
    assert st_mnrl_recipe.mining_corpus(None, str(path)) is None
    path.write_text("a\tb\tyes\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.tsv:1: label 'yes' is not an integer"):
        st_mnrl_recipe.training_rows(str(path), None)
    path.write_text("a\tb\t1\tc\n", encoding="utf-8")
    with pytest.raises(ValueError, match="train.tsv:1: 4 tab-separated columns"):
        bench.common.read_pair_file(path)
