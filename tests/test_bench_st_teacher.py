"""bench.st_mnrl_recipe's teacher options (issue 71's peer given the same teacher): the combined
loss is MNRL plus the weighted distillation (KL as the pipeline's, without the peer's T²), the
denoising drops what the pipeline's rule drops, mining with the teacher keeps each pair's
nearest survivors, a tiny run trains end to end; and bench.hard_negatives' st-teacher peers'
commands. Tiny models only, nothing reads ../shared."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bench.hard_negatives as hn
from bench import st_mnrl_recipe as st

ROWS = [
    ("the storm hits the coast", "a storm batters the coast", "markets fall on monday", "a cat sleeps"),
    ("stocks slide again", "markets fall on monday", "the storm hits the coast", "rain in spain"),
    ("a cat sleeps on the mat", "the cat naps on a mat", "stocks slide again", "the storm hits"),
    ("rain falls in spain", "it rains in spain", "a cat sleeps", "markets rise"),
]


def tiny_st(model_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = 32
    return model.eval()  # no dropout: every forward of a text gives the same embedding


def features_of(model, columns):
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    return [preprocess(list(column)) for column in columns]


def log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("kind", ["kl", "margin_mse"])
def test_the_combined_loss_is_mnrl_plus_the_weighted_distillation(tiny_model_dir, kind):
    import torch

    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    from pipeline.training.distillation_loss import distillation_loss

    model = tiny_st(tiny_model_dir)
    columns = list(zip(*ROWS, strict=True))  # anchor, positive, negative_1, negative_2
    teacher = np.array([[0.9, 0.3, 0.1], [0.8, 0.6, 0.2], [0.7, 0.65, 0.0], [0.95, 0.2, 0.4]], np.float32)
    labels = teacher if kind == "kl" else teacher[:, :1] - teacher[:, 1:]
    weight = 0.7
    loss = st.mnrl_with_distillation(model, kind, weight, st.mnrl(model))
    with torch.no_grad():
        combined = float(loss(features_of(model, columns), torch.tensor(labels)))
        plain_mnrl = float(MultipleNegativesRankingLoss(model, scale=20.0)(features_of(model, columns), None))
        vectors = [
            torch.nn.functional.normalize(model(f)["sentence_embedding"], dim=-1).numpy().astype(np.float64)
            for f in features_of(model, columns)
        ]

    # Independently, in numpy: MNRL over every row's positive and negatives at scale 20 ...
    anchors, candidates = vectors[0], vectors[1:]
    logits = 20.0 * anchors @ np.concatenate(candidates).T
    mnrl = -np.mean(log_softmax(logits)[np.arange(len(ROWS)), np.arange(len(ROWS))])
    # ... and the distillation of the teacher's scores of each row's own candidates.
    student = np.stack([(anchors * c).sum(axis=1) for c in candidates], axis=1)
    if kind == "kl":
        t = 0.05
        teacher_logs = log_softmax(teacher.astype(np.float64) / t)
        distill = np.mean((np.exp(teacher_logs) * (teacher_logs - log_softmax(student / t))).sum(axis=1))
    else:
        distill = np.mean(((student[:, :1] - student[:, 1:]) - labels) ** 2)
    assert plain_mnrl == pytest.approx(mnrl, rel=1e-4, abs=1e-5)
    assert combined == pytest.approx(mnrl + weight * distill, rel=1e-4, abs=1e-5)
    # The weight means what the pipeline's train.distill_weight means: its term is the same number.
    ours, _ = distillation_loss(
        torch.tensor(student), torch.tensor(teacher), torch.ones(teacher.shape, dtype=torch.bool),
        kind=kind, temperature=0.05,
    )  # fmt: skip
    assert float(ours) == pytest.approx(distill, rel=1e-4, abs=1e-6)


def test_denoising_drops_exactly_what_the_rule_says():
    from pipeline.mining.teacher_scores import denoised

    # Ties at the threshold (dropped) and every score exact in float32: multiples of 1/64.
    rng = np.random.default_rng(0)
    rows, depth, keep, margin = 200, 6, 2, 0.0625
    scores = rng.integers(0, 64, size=(rows, 1 + depth)) / 64.0
    negatives = rng.permutation(rows * depth).reshape(rows, depth)
    got = [
        st.teacher_denoised(
            [f"n{i}" for i in negatives[r]],
            list(scores[r, 1:]),
            positive_score=scores[r, 0],
            margin=margin,
            keep=keep,
        )  # fmt: skip
        for r in range(rows)
    ]
    # A plain per-row loop of the rule ...
    for r, (kept, dropped) in enumerate(got):
        survivors = [
            f"n{n}" for n, s in zip(negatives[r], scores[r, 1:], strict=True) if s < scores[r, 0] - margin
        ]
        assert kept == survivors[:keep] and dropped == depth - len(survivors)
    # ... and the pipeline's own denoising (mining.teacher.denoise_margin) on the same arrays.
    theirs, _, theirs_dropped = denoised(
        negatives, scores.astype(np.float32), margin=margin, mined=depth, keep=keep
    )
    assert sum(d for _, d in got) == len(theirs_dropped) > 0
    for (kept, _), row in zip(got, theirs, strict=True):
        assert kept == [f"n{n}" for n in row if n >= 0]
    assert {len(kept) for kept, _ in got} == {0, 1, 2}  # some rows left short: those are not trained
    assert st.teacher_denoised(["a", "b"], [0.5, 0.4], positive_score=0.75, margin=0.25, keep=1) == (["b"], 1)


def test_denoise_depth_is_four_times_k_within_the_window():
    assert st.denoise_depth(st.PeerMining(range_min=0, range_max=None, num_negatives=1)) == 4
    assert st.denoise_depth(st.PeerMining(range_min=10, range_max=64, num_negatives=3)) == 12
    assert st.denoise_depth(st.PeerMining(range_min=10, range_max=16, num_negatives=3)) == 6
    assert st.denoise_depth(st.PeerMining(range_min=0, range_max=2, num_negatives=2)) == 2


def test_mining_with_the_teacher_keeps_each_pairs_nearest_survivors(tiny_model_dir, paraphrase_pairs):
    """``mine_negatives(denoise=...)`` against ``mine_hard_negatives`` itself at the same depth
    and the rule applied row by row to the teacher's scores (the tiny random model is student
    and teacher: only the mechanics are under test, so no trained model is needed)."""
    import contextlib
    import io

    import datasets
    from sentence_transformers.util import mine_hard_negatives

    anchors, positives = paraphrase_pairs
    rows = {"anchor": list(anchors), "positive": list(positives)}
    model = tiny_st(tiny_model_dir)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        listed = mine_hard_negatives(
            datasets.Dataset.from_dict(rows), model, range_min=0, range_max=16, num_negatives=8,
            sampling_strategy="top", output_format="labeled-list", batch_size=64, use_faiss=True,
            verbose=False,
        ).to_dict()  # fmt: skip
    scorer = st.TeacherScorer(tiny_model_dir, max_seq_len=32)
    scores = scorer.scores(listed["anchor"], listed["positive"])  # [positive, negatives...] a pair
    # The teacher's scores are its cosines ...
    texts = sorted({*anchors, *positives})
    vectors = dict(zip(texts, model.encode(texts, batch_size=64, normalize_embeddings=True), strict=True))
    anchor, (positive, negative) = listed["anchor"][0], listed["positive"][0][:2]
    assert scores[0][:2] == pytest.approx(
        [vectors[anchor] @ vectors[c] for c in (positive, negative)], abs=1e-5
    )
    # ... and a margin at the median gap drops about half the candidates.
    margin = float(np.median([pos - neg for pos, *negs in scores for neg in negs]))
    expected, dropped = {}, 0
    for anchor, (positive, *negatives), (pos, *negs) in zip(
        listed["anchor"], listed["positive"], scores, strict=True
    ):
        survivors = [n for n, score in zip(negatives, negs, strict=True) if score < pos - margin]
        dropped += len(negatives) - len(survivors)
        if len(survivors) >= 2:
            expected[(anchor, positive)] = survivors[:2]

    settings = st.PeerMining(range_min=0, range_max=16, relative_margin=None, num_negatives=2)
    mined, report = st.mine_negatives(
        tiny_model_dir, rows, settings, max_seq_len=32, seed=0, denoise=st.TeacherDenoise(scorer, margin)
    )
    assert report["teacher_depth"] == 8 and report["teacher_denoised"] == dropped > 0
    assert list(mined) == ["anchor", "positive", "mined_negative_1", "mined_negative_2"]
    assert report["mined_anchors"] == len(mined["anchor"]) > 0
    kept = [pair for pair in zip(anchors, positives, strict=True) if pair in expected]
    assert list(zip(mined["anchor"], mined["positive"], strict=True)) == kept  # the rows' own order
    assert [
        [n1, n2] for n1, n2 in zip(mined["mined_negative_1"], mined["mined_negative_2"], strict=True)
    ] == [expected[pair] for pair in kept]
    # Distillation labels come from the same teacher, no text encoded twice.
    encoded = len(scorer._row)
    labels = st.distillation_labels(scorer, mined, "margin_mse")
    a, p, n1 = mined["anchor"][0], mined["positive"][0], mined["mined_negative_1"][0]
    assert labels[0][0] == pytest.approx(float(vectors[a] @ vectors[p] - vectors[a] @ vectors[n1]), abs=1e-5)
    assert len(labels[0]) == 2 and len(scorer._row) == encoded


def tiny_mined_peer_argv(tmp_path, tiny_model_dir, paraphrase_pairs) -> list[str]:
    """``bench.st_mnrl_recipe``'s arguments for a tiny peer on ``paraphrase_pairs`` (written to
    a jsonl under ``tmp_path``), its negatives mined: 96 rows in batches of 16, the 16 nearest,
    no margin."""
    anchors, positives = paraphrase_pairs
    train = tmp_path / "train.jsonl"
    train.write_text(
        "".join(
            json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in zip(anchors, positives, strict=True)
        ),
        encoding="utf-8",
    )
    return [
        "--model", str(tiny_model_dir), "--train", str(train), "--max-rows", "96", "--batch-size", "16",
        "--out", str(tmp_path / "out"), "--no-duplicates", "--mine-hard-negatives", "--range-min", "0",
        "--range-max", "16", "--relative-margin", "-1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("teacher_args", "distill"),
    [
        (["--teacher-denoise-margin", "0.002", "--distill", "kl"], "kl"),
        (["--distill", "margin_mse"], "margin_mse"),
    ],
)
def test_a_tiny_peer_trains_with_the_teacher(
    tmp_path, capsys, tiny_model_dir, paraphrase_pairs, teacher_args, distill
):
    argv = [
        *tiny_mined_peer_argv(tmp_path, tiny_model_dir, paraphrase_pairs), "--teacher", str(tiny_model_dir),
        *teacher_args, "--distill-weight", "0.5",
    ]  # fmt: skip
    assert st.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["distill"] == distill and result["distill_weight"] == 0.5 and result["steps"] > 0
    assert result["rows"] == result["mined_anchors"] > 0
    assert ("teacher_denoised" in result) == ("--teacher-denoise-margin" in teacher_args)
    assert (tmp_path / "out" / "model" / "config.json").exists()


def test_a_tiny_peer_trains_with_hardness_weighted_negatives_and_gtes_directions(
    tmp_path, capsys, tiny_model_dir, paraphrase_pairs
):
    """``--hardness-strength``: MNRL's own hardness weighting (``hard_negatives`` mode), and
    ``--directions``: its terms in one joint softmax, on mined triplets, both reported in the
    result line; a negative strength or an unknown direction stops at the parser."""
    argv = tiny_mined_peer_argv(tmp_path, tiny_model_dir, paraphrase_pairs)
    gte = "query_to_doc,query_to_query,doc_to_query,doc_to_doc"
    assert st.main([*argv, "--hardness-strength", "2", "--directions", gte]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        result["hardness_strength"] == 2.0 and "hardness-weighted" in result["peer"] and result["steps"] > 0
    )
    assert result["directions"] == gte.split(",") and "directions" in result["peer"]
    loss = st.mnrl(None, 2.0, tuple(gte.split(",")))
    assert (loss.hardness_mode, loss.hardness_strength) == ("hard_negatives", 2.0)
    assert (loss.directions, loss.partition_mode) == (tuple(gte.split(",")), "joint")
    for bad in (
        ["--hardness-strength", "-1"],
        ["--directions", "doc_to_query"],
        ["--directions", "query_to_doc,x"],
    ):
        with pytest.raises(SystemExit):
            st.main([*argv, *bad])


def test_the_teacher_options_need_each_other(tmp_path):
    base = ["--model", "m", "--train", "t.txt", "--out", str(tmp_path)]
    for extra in (
        ["--distill", "kl"],
        ["--teacher", "t"],
        ["--teacher", "t", "--teacher-denoise-margin", "0.05"],
    ):
        with pytest.raises(SystemExit):
            st.main([*base, *extra])


def test_the_teacher_peers_are_st_mined_with_the_t_arms_teacher_settings(tmp_path, monkeypatch):
    task = hn.Task(
        name="twitter-url", config="jobs/configs/recipe-twitter-url.yaml", max_rows=None, epochs=3,
        data_path=str(tmp_path / "train.tsv"), model=str(tmp_path / "minilm"), sts=None, lr=5e-5,
        batch_size=64, max_seq_len=32, tracking_uri=f"sqlite:///{tmp_path}/mlruns.db", experiment="bench",
        dev=str(tmp_path / "dev"), warmup_ratio=0.1,
    )  # fmt: skip
    calls = []

    def fake_run_logged(cmd, log):
        calls.append(cmd)
        if cmd[1:3] == ["-m", "bench.st_mnrl_recipe"]:
            line = {"steps": 300, "rows": 6400, "train_seconds": 600.0, "mined_anchors": 6400,
                    "teacher": hn.TEACHER, "teacher_denoised": 900, "teacher_seconds": 50.0, "distill": "kl",
                    "distill_weight": 1.0, "model_dir": cmd[cmd.index("--out") + 1] + "/model"}  # fmt: skip
            return 0, 700.0, json.dumps(line)
        scores = dict.fromkeys(hn.RETRIEVAL_SCORES, 90.0)
        return 0, 20.0, json.dumps({"retrieval": [{"name": "dev", **scores}]})

    monkeypatch.setattr(hn, "run_logged", fake_run_logged)
    commands = {}
    for arm in ("st-mined", "st-teacher-d", "st-teacher-k", "st-teacher-dk", "st-mined-h", "st-mined-gte"):
        assert hn.variant_overrides("twitter-url", arm) is None
        calls.clear()
        record = hn.run_retrieval_arm(task, arm, 1, keep_dir=True)
        commands[arm] = calls[0]
    for command in commands.values():  # each under its own run folder
        command[command.index("--out") + 1] = "OUT"
    base = commands["st-mined"]
    assert base[base.index("--no-duplicates") :] == ["--no-duplicates", *hn.st_mined(1)]  # as it was
    teacher, margin = ["--teacher", hn.TEACHER], ["--teacher-denoise-margin", str(hn.TEACHER_MARGIN)]
    kl = ["--distill", "kl", "--distill-weight", "1.0"]
    assert commands["st-teacher-d"] == [*base, *teacher, *margin]
    assert commands["st-teacher-k"] == [*base, *teacher, *kl]
    assert commands["st-teacher-dk"] == [*base, *teacher, *margin, *kl]
    assert commands["st-mined-h"] == [*base, "--hardness-strength", str(hn.HARDNESS_STRENGTH)]  # as SH
    assert commands["st-mined-gte"] == [*base, "--directions", hn.GTE_DIRECTIONS]  # as SG
    assert record["teacher_denoised"] == 900 and record["distill"] == "kl" and record["ndcg_at_10"] == 90.0
    assert hn.parse_list(hn.TASKS["twitter-url"].variants)[-6:] == [
        "st-teacher-d",
        "st-teacher-k",
        "st-teacher-dk",
        "st-given",
        "st-mined-h",
        "st-mined-gte",
    ]
