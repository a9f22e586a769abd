"""bench/hard_negatives.py's pure parts: variants per task, the peer's mining options, the report."""

from __future__ import annotations

import pytest
from conftest import load_script

from pipeline.config.mining_section import MiningSection


@pytest.fixture(scope="module")
def hn():
    return load_script("bench/hard_negatives.py", "hard_negatives")


def test_sampler_variants_of_the_unsupervised_tasks(hn):
    assert hn.variant_overrides("cnsd", "peer") is None
    assert hn.variant_overrides("cnsd", "random-norefresh") == ["mining.enabled=false"]
    assert hn.variant_overrides("wiki", "knn+cluster-debias") == [
        "mining.batch_sampler=knn",
        "mining.debias=cluster",
    ]
    for variant in hn.parse_list(hn.TASKS["cnsd"].variants):
        hn.variant_overrides("cnsd", variant)  # the defaults are all valid


def test_triplet_variants_of_snli(hn):
    assert hn.variant_overrides("snli", "given") == ["mining.enabled=false"]
    assert hn.variant_overrides("snli", "mined") == ["mining.enabled=true", "mining.num_negatives=1"]
    assert "mining.random_negatives=1" in hn.variant_overrides("snli", "mined+random")
    assert hn.variant_overrides("snli", "peer") is None and hn.variant_overrides("snli", "peer-mined") is None
    assert hn.TASKS["snli"].baseline == "given" and hn.TASKS["snli"].epochs == 2
    for variant in hn.parse_list(hn.TASKS["snli"].variants):
        hn.variant_overrides("snli", variant)


@pytest.mark.parametrize(
    ("task", "variant", "hint"),
    [
        ("snli", "knn", "neighbourhood mode"),
        ("snli", "random+debias", "neighbourhood mode"),
        ("snli", "random-norefresh", "neighbourhood mode"),
        ("cnsd", "given", "triplet mode"),
        ("wiki", "peer-mined", "triplet mode"),
        ("cnsd", "mined+random", "triplet mode"),
    ],
)
def test_a_variant_of_the_other_mode_is_rejected_saying_why(hn, task, variant, hint):
    with pytest.raises(ValueError, match=hint) as raised:
        hn.variant_overrides(task, variant)
    assert f"task {task}'s" in str(raised.value)


@pytest.mark.parametrize(("task", "variant"), [("snli", "nope"), ("cnsd", "knn+nope"), ("cnsd", "bogus")])
def test_an_unknown_variant_is_rejected_naming_the_known_ones(hn, task, variant):
    with pytest.raises(ValueError, match="unknown|not one of") as raised:
        hn.variant_overrides(task, variant)
    assert "mode" not in str(raised.value)
    assert ("mined+random" if task == "snli" else "random-norefresh") in str(raised.value)


def test_the_peer_mines_with_the_pipelines_settings(hn):
    args = hn.peer_mining_args(MiningSection(negative_mode="triplet"))
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert args[0] == "--mine-hard-negatives"
    assert options == {
        "--range-min": "10",
        "--range-max": "64",  # mining.top_k: the candidates searched
        "--relative-margin": "0.05",
        "--num-negatives": "1",
        "--sampling": "top",
        "--mining-batch-size": "64",
    }
    args = hn.peer_mining_args(MiningSection(range_max=32, relative_margin=None))
    assert args[args.index("--range-max") + 1] == "32" and args[args.index("--relative-margin") + 1] == "-1.0"


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
        {**record("rwr", 1, 50.5), "task": "cnsd"},
        {**record("rwr", 2, 53.4), "task": "cnsd"},
        {**record("rwr", 3, 60.0), "task": "cnsd"},  # no baseline at seed 3: left out of Δ
        {**record("peer", 1, 50.5), "task": "cnsd"},
        {**record("peer", 2, 53.4), "task": "cnsd"},
    ]
    lines = hn.report(records).splitlines()
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}
    assert rows["rwr"][3] == "+0.45 ± 0.07 (outside spread, 2 seeds)"
    # The same scores from the peer, its own trainer: only the means compare, within 2.1 + 2.1.
    assert rows["peer"][3] == "+0.45 (within spread)"
    assert hn.paired_difference({3: 1.0}, {1: 0.0}) == "n/a"
    assert hn.paired_difference({1: 1.0, 2: 7.0}, {1: 0.0, 2: 0.0}) == "+4.00 ± 4.24 (within spread, 2 seeds)"


def test_the_peers_mining_joins_each_mined_negative_to_its_own_row(
    tmp_path, trained_tiny_model_dir, paraphrase_pairs
):
    """``st_mnrl_recipe.py --mine-hard-negatives``: sentence-transformers returns its rows
    reordered; each kept row must get the negative mined for its own (anchor, positive), one
    that passes the relative margin against that pair under the same model."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    peer = load_script("bench/st_mnrl_recipe.py", "st_mnrl_recipe")
    anchors, positives = paraphrase_pairs
    rows = {
        "anchor": list(anchors),
        "positive": list(positives),
        "negative": [f"given {i}" for i in range(len(anchors))],
    }
    settings = peer.PeerMining(range_min=2, range_max=16, relative_margin=0.05, num_negatives=1)
    mined, report = peer.mine_negatives(trained_tiny_model_dir, rows, settings, max_seq_len=32, seed=0)

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
