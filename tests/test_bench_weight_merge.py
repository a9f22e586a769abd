"""``bench.weight_merge``: merged weights against numpy's own blend, a merged folder that loads
and encodes, clear errors for models that do not match, and the paired deltas' arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel

from bench.weight_merge import merged_state, weight_deltas, write_merged_dir
from pipeline.evaluation.folder_encoder import FolderEncoder
from pipeline.model.tiny import build_random_bert_dir

TEXTS = [f"sentence number {i} about {w}" for i, w in enumerate(["cats", "dogs", "rain", "tea"] * 20)]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    start = build_random_bert_dir(TEXTS, root / "start", max_seq_len=16, dropout=0.1, seed=1)
    tuned = build_random_bert_dir(TEXTS, root / "tuned", max_seq_len=16, dropout=0.1, seed=2)
    return start, tuned


def test_merged_state_is_the_blend_numpy_computes():
    rng = np.random.default_rng(0)
    tuned = {"w": torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32), "ids": torch.arange(5)}
    start = {"w": torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32), "ids": torch.arange(5) + 7}
    for weight in (0.0, 0.25, 1.0):
        got = merged_state(tuned, start, weight)
        expected = (1 - weight) * tuned["w"].numpy().astype(np.float64) + weight * start["w"].numpy()
        np.testing.assert_allclose(got["w"].numpy(), expected, rtol=0, atol=1e-6)
        assert torch.equal(got["ids"], tuned["ids"])  # integer buffers are the fine-tuned model's
    half = merged_state({"w": tuned["w"].half()}, {"w": start["w"].half()}, 0.5)
    assert half["w"].dtype == torch.float16


def test_models_that_do_not_match_are_named():
    tuned = {"a": torch.zeros(2), "b": torch.zeros(2)}
    with pytest.raises(ValueError, match="'b' is only in the fine-tuned model"):
        merged_state(tuned, {"a": torch.zeros(2)}, 0.1)
    with pytest.raises(ValueError, match=r"'a': shape \(2,\) against \(3,\)"):
        merged_state({"a": torch.zeros(2)}, {"a": torch.zeros(3)}, 0.1)
    with pytest.raises(ValueError, match="must be within"):
        merged_state(tuned, tuned, 1.5)
    # An integer buffer one side saved (older transformers kept BERT's position_ids) is no weight.
    got = merged_state({"a": torch.ones(2)}, {"a": torch.zeros(2), "ids": torch.arange(3)}, 0.5)
    assert list(got) == ["a"] and torch.equal(got["a"], torch.full((2,), 0.5))


def test_merged_folder_loads_with_the_blended_weights_and_encodes(two_models, tmp_path):
    start, tuned = two_models
    out = write_merged_dir(tuned, start, 0.3, tmp_path / "merged")
    merged = AutoModel.from_pretrained(out).state_dict()
    start_sd, tuned_sd = (
        AutoModel.from_pretrained(start).state_dict(),
        AutoModel.from_pretrained(tuned).state_dict(),
    )
    for name, value in merged.items():
        if value.is_floating_point():
            expected = 0.7 * tuned_sd[name].double() + 0.3 * start_sd[name].double()
            np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=0, atol=1e-6)
    # The merged model sits between its parents: its embeddings differ from either's.
    vectors = {
        name: FolderEncoder.load(folder, batch_size=8).encode_texts(TEXTS[:4])
        for name, folder in {"merged": out, "start": start, "tuned": tuned}.items()
    }
    assert np.isfinite(vectors["merged"]).all()
    assert not np.allclose(vectors["merged"], vectors["tuned"]) and not np.allclose(
        vectors["merged"], vectors["start"]
    )
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        write_merged_dir(tmp_path, start, 0.3, tmp_path / "again")


def test_weight_deltas_pair_each_model_with_itself_unmerged():
    rows = [
        {"model": "a", "start_weight": 0.0, "ndcg_at_10": 80.0},
        {"model": "a", "start_weight": 0.2, "ndcg_at_10": 80.5},
        {"model": "b", "start_weight": 0.0, "ndcg_at_10": 82.0},
        {"model": "b", "start_weight": 0.2, "ndcg_at_10": 82.1},
        {"model": "b", "start_weight": 0.4, "ndcg_at_10": 81.0},
    ]
    got = weight_deltas(rows)
    assert got[0.2] == pytest.approx((0.3, float(np.std([0.5, 0.1], ddof=1)), 2))
    assert got[0.4] == pytest.approx((-1.0, 0.0, 1))
    assert 0.0 not in got


def test_main_scores_each_model_at_each_weight_and_w0_is_the_model_itself(two_models, tmp_path, capsys):
    from bench.weight_merge import main
    from pipeline.evaluation.retrieval_scoring import evaluate_retrieval_model_dir

    start, tuned = two_models
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = TEXTS[:12]
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t.upper()}) + "\n" for i, t in enumerate(docs[:6]))
    )
    (beir / "qrels" / "dev.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(6))
    )
    results = tmp_path / "rows.jsonl"
    argv = ["--start", str(start), "--models", f"{tuned},{start}", "--start-weights", "0.5"]
    assert main([*argv, "--retrieval", str(beir), "--results", str(results)]) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(Path(r["model"]).name, r["start_weight"]) for r in rows] == [
        ("tuned", 0.0),
        ("tuned", 0.5),
        ("start", 0.0),
        ("start", 0.5),
    ]
    (direct,) = evaluate_retrieval_model_dir(tuned, [str(beir)])
    assert rows[0]["ndcg_at_10"] == pytest.approx(direct.ndcg_at_10)
    # The start merged with itself is the start: the same score.
    assert rows[3]["ndcg_at_10"] == pytest.approx(rows[2]["ndcg_at_10"])
    assert "minus unmerged" in capsys.readouterr().out
    # Run again with one more weight: the rows there are read, only the new weight is scored.
    assert main([*argv, "--start-weights", "0.5,1", "--retrieval", str(beir), "--results", str(results)]) == 0
    again = [json.loads(line) for line in results.read_text().splitlines()]
    assert again[:4] == rows and [(Path(r["model"]).name, r["start_weight"]) for r in again[4:]] == [
        ("tuned", 1.0),
        ("start", 1.0),
    ]
    # All the way to the start is the start.
    assert again[4]["ndcg_at_10"] == pytest.approx(rows[2]["ndcg_at_10"])
