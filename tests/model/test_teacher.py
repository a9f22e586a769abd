"""The teacher's scores against sentence-transformers reading the same folders: a bi-encoder's
cosines (``SentenceTransformer``), a cross-encoder's logits (``CrossEncoder``), and the Ray Data
batch form adding its column."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.model.accel import native_bf16
from pipeline.model.teacher import PAIR_ENTRY_BYTES, Teacher, TeacherSettings

ANCHORS = ["a cat sat on the mat", "the stock market fell", "a cat sat on the mat", "rain again today"]
CANDIDATES = ["a cat on a mat", "markets dropped sharply", "the weather is sunny", "it is raining"]


def test_a_bi_encoder_teacher_scores_the_cosine_sentence_transformers_gives(tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    # A plain Hugging Face folder: sentence-transformers reads it with mean pooling.
    settings = TeacherSettings(str(tiny_model_dir), pooler="mean", max_seq_len=32, batch_size=3)
    teacher = Teacher(settings, device="cpu")
    # bf16 where the CPU computes it natively; fp32 for parity with the peer's fp32.
    assert teacher.bf16 == native_bf16(torch.device("cpu"))
    in_its_precision = teacher.score(ANCHORS, CANDIDATES)
    teacher = Teacher(settings, device="cpu")
    teacher.bf16 = False
    scores = teacher.score(ANCHORS, CANDIDATES)
    peer = SentenceTransformer(str(tiny_model_dir), device="cpu")
    left = peer.encode(ANCHORS, normalize_embeddings=True, convert_to_numpy=True)
    right = peer.encode(CANDIDATES, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(scores, (left * right).sum(axis=1), atol=1e-5)
    assert scores.dtype == in_its_precision.dtype == np.float32
    # bf16's rounding, within what the mpnet teacher measured (0.0026 at most, docs/results.md).
    np.testing.assert_allclose(in_its_precision, scores, atol=3e-3)


def test_a_bi_encoder_teacher_reads_a_text_once_and_keeps_no_more_than_its_cache_holds(tiny_model_dir):
    """A text scored again (an anchor in each denoising step, a positive at each refresh) comes
    from the cache, with the score an uncached teacher gives; past the cache's bytes, texts are
    encoded again."""
    settings = TeacherSettings(str(tiny_model_dir), pooler="mean", max_seq_len=32, batch_size=3)
    teacher, uncached = Teacher(settings, device="cpu"), Teacher(settings, device="cpu")
    teacher.bf16 = uncached.bf16 = False
    uncached.cache_bytes = 0
    assert teacher.cache_bytes > 2**20
    first = teacher.score(ANCHORS, CANDIDATES)
    assert teacher.texts_encoded == len(set(ANCHORS + CANDIDATES)) == 7 and len(teacher.cached) == 7
    again = ["a brand new headline", CANDIDATES[0]]
    second = teacher.score(ANCHORS[:2], again)
    assert teacher.texts_encoded == 8  # only the new text
    np.testing.assert_allclose(first, uncached.score(ANCHORS, CANDIDATES), atol=1e-5)
    np.testing.assert_allclose(second, uncached.score(ANCHORS[:2], again), atol=1e-5)
    assert uncached.cached == {} and uncached.texts_encoded == 7 + 4

    small = Teacher(settings, device="cpu")
    entry = next(iter(teacher.cached.values())).nbytes + 100
    small.cache_bytes = 2 * (entry + max(len(t) for t in ANCHORS + CANDIDATES))
    small.score(ANCHORS, CANDIDATES)
    assert len(small.cached) == 2 and small.texts_encoded == 7
    small.score(ANCHORS, CANDIDATES)
    assert small.texts_encoded == 7 + 5


def test_a_cross_encoder_teacher_scores_the_logits_cross_encoder_predicts(tiny_cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    # The kind is read from the folder: a one-label sequence classifier is a cross-encoder.
    teacher = Teacher(
        TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32, batch_size=3), device="cpu"
    )
    assert teacher.settings.kind == "cross_encoder"
    scores = teacher.score(ANCHORS, CANDIDATES)
    peer = CrossEncoder(str(tiny_cross_encoder_dir), device="cpu", max_length=64)
    expected = peer.predict(list(zip(ANCHORS, CANDIDATES, strict=True)), activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert len(set(np.round(scores, 6))) > 1  # the pairs score apart


def test_a_teacher_sent_through_ray_leaves_no_copy_of_itself_on_the_node(
    tiny_cross_encoder_dir, tmp_path, monkeypatch
):
    """A miner shard loads the teacher from the folder the driver packed: unpacked, loaded and
    the folder removed, with the same scores as the folder itself gives."""
    from pipeline.model.folders import pack_dir
    from pipeline.model.teacher import load_teacher

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the node's temp folder
    settings = TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32)
    sent = load_teacher(settings, blob=pack_dir(tiny_cross_encoder_dir), device="cpu")
    assert list(tmp_path.iterdir()) == []
    expected = Teacher(settings, device="cpu").score(ANCHORS, CANDIDATES)
    np.testing.assert_allclose(sent.score(ANCHORS, CANDIDATES), expected, atol=1e-6)


def test_a_cross_encoder_teacher_scores_in_chunks_what_it_scores_at_once(tiny_cross_encoder_dir, monkeypatch):
    """Pairs tokenized a chunk at a time and batched in length order come back in the order asked."""
    import pipeline.model.teacher as teacher_module

    anchors, candidates = ANCHORS * 3, CANDIDATES[1:] * 4
    at_once = Teacher(TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32), device="cpu")
    expected = at_once.score(anchors, candidates)
    monkeypatch.setattr(teacher_module, "PAIR_CHUNK", 5)
    chunked = Teacher(
        TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32, batch_size=2), device="cpu"
    )
    np.testing.assert_allclose(chunked.score(anchors, candidates), expected, atol=1e-5)
    assert chunked.pairs_scored == len(set(zip(anchors, candidates, strict=True))) == 9  # 2 chunks


def test_a_cross_encoder_teacher_reads_a_pair_at_twice_a_texts_length(tiny_cross_encoder_dir):
    """``max_seq_len`` is a text's: a pair of two texts of 20 tokens each is read whole at 32,
    not cut to 32 tokens in all (which loses most of the candidate)."""
    from sentence_transformers import CrossEncoder

    teacher = Teacher(TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32), device="cpu")
    anchor, candidate = " ".join(ANCHORS[:2]), " ".join(CANDIDATES[:2])
    lengths = [len(teacher.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (anchor, candidate)]
    assert min(lengths) > 16 and sum(lengths) + 3 <= 64, lengths
    score = teacher.score([anchor], [candidate])
    pairs = [(anchor, candidate)]
    whole, cut = (
        CrossEncoder(str(tiny_cross_encoder_dir), device="cpu", max_length=n).predict(
            pairs, activation_fn=torch.nn.Identity()
        )
        for n in (64, 32)
    )
    # A random tiny head's logits sit near 0: what tells the two readings apart is that the
    # teacher's is ten times nearer the whole pair's than the cut pair's.
    assert abs(float(score[0] - whole[0])) * 10 < abs(float(score[0] - cut[0]))


def test_a_cross_encoder_teacher_scores_a_pair_once_and_keeps_no_more_than_its_cache_holds(
    tiny_cross_encoder_dir,
):
    """A pair scored again (a positive at each refresh, a candidate still among its anchor's
    neighbours) comes from the cache, with the logit an uncached teacher gives; a pair repeated
    in one call is scored once; past the cache's bytes, pairs are scored again."""
    settings = TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=32, batch_size=3)
    teacher, uncached = Teacher(settings, device="cpu"), Teacher(settings, device="cpu")
    uncached.cache_bytes = 0
    assert teacher.cache_bytes > 2**20
    # The first and third pairs of ANCHORS x CANDIDATES differ; a pair repeated is scored once.
    first = teacher.score([*ANCHORS, ANCHORS[0]], [*CANDIDATES, CANDIDATES[0]])
    assert teacher.pairs_scored == len(ANCHORS) == 4 and len(teacher.cached) == 4
    anchors, candidates = [ANCHORS[1], ANCHORS[0]], [CANDIDATES[1], CANDIDATES[1]]
    second = teacher.score(anchors, candidates)
    assert teacher.pairs_scored == 5  # only the new pair: the same texts, paired anew
    np.testing.assert_allclose(first[:4], uncached.score(ANCHORS, CANDIDATES), atol=1e-5)
    assert first[4] == first[0]
    np.testing.assert_allclose(second, uncached.score(anchors, candidates), atol=1e-5)
    assert second[0] == first[1]
    assert uncached.cached == {} and uncached.pairs_scored == 4 + 2

    small = Teacher(settings, device="cpu")
    longest = max(len(a) + len(c) for a, c in zip(ANCHORS, CANDIDATES, strict=True))
    small.cache_bytes = 2 * (longest + PAIR_ENTRY_BYTES)
    small.score(ANCHORS, CANDIDATES)
    assert len(small.cached) == 2 and small.pairs_scored == 4
    small.score(ANCHORS, CANDIDATES)
    assert small.pairs_scored == 4 + 2


def test_a_ray_data_batch_gets_a_teacher_score_column_and_a_bad_kind_is_named(tiny_model_dir):
    teacher = Teacher(TeacherSettings(str(tiny_model_dir), max_seq_len=32), device="cpu")
    batch = {"anchor": np.array(ANCHORS, dtype=object), "candidate": np.array(CANDIDATES, dtype=object)}
    out = teacher(dict(batch))
    np.testing.assert_array_equal(out["teacher_score"], teacher.score(ANCHORS, CANDIDATES))
    assert list(out["anchor"]) == ANCHORS
    with pytest.raises(ValueError, match="teacher kind must be one of bi_encoder, cross_encoder .got 'ce'"):
        Teacher(TeacherSettings(str(tiny_model_dir), kind="ce"), device="cpu")


@pytest.mark.parametrize(
    ("folder", "overrides", "expected"),
    [
        ("cross", [], 1.0),  # a cross-encoder's scores are logits already
        ("bi", [], 0.07),  # a bi-encoder's are cosines, read as the student's are
        ("cross", ["mining.teacher.temperature=2.5"], 2.5),  # set: kept
        ("cross", ["train.distill_weight=0"], None),  # not distilled: not needed
    ],
)
def test_the_job_reads_a_distilled_teachers_scores_at_the_temperature_of_its_kind(
    tiny_model_dir, tiny_cross_encoder_dir, folder, overrides, expected
):
    from pipeline.config.loading import load_config
    from pipeline.jobs.train_job import resolve_config

    teacher = tiny_cross_encoder_dir if folder == "cross" else tiny_model_dir
    base = ["task=pairs", "data.path=rows.jsonl", "data.format=jsonl", "train.temperature=0.07"]
    cfg = load_config(
        None, [*base, f"mining.teacher.model={teacher}", "train.distill_weight=1.0", *overrides]
    )
    assert cfg.mining.teacher.temperature == (2.5 if overrides and "2.5" in overrides[0] else None)
    assert resolve_config(cfg).mining.teacher.temperature == expected


def test_a_cross_encoder_teacher_reads_no_pair_past_its_tokenizers_limit(tiny_cross_encoder_dir):
    """At ``max_seq_len`` 512 a pair is cut at the tokenizer's limit (64 here, as a real
    cross-encoder's 512), not at 1,024 tokens past the model's positions."""
    from sentence_transformers import CrossEncoder

    teacher = Teacher(TeacherSettings(str(tiny_cross_encoder_dir), max_seq_len=512), device="cpu")
    anchor, candidate = " ".join(ANCHORS), " ".join(CANDIDATES)  # 35 and 39 tokens
    score = teacher.score([anchor], [candidate])
    expected = CrossEncoder(str(tiny_cross_encoder_dir), device="cpu", max_length=64).predict(
        [(anchor, candidate)], activation_fn=torch.nn.Identity()
    )
    np.testing.assert_allclose(score, expected, atol=1e-5)
