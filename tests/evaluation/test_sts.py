"""STS readers, Spearman and jobs/evaluate.py against independent computations on files made here."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import PYTHON, REPO, run_script_in_process
from scipy.stats import spearmanr

from bench.common import job_env
from pipeline.core.errors import DataError
from pipeline.evaluation.sts import read_sts, spearman

# (sentence1, sentence2, score): a quote inside a sentence, as STS-B has
PAIRS = [
    ('A man said "hello" to the dog.', "A man greets a dog.", 4.2),
    ("A woman is slicing an onion.", 'She cuts "an onion".', 3.8),
    ("Kids play football.", "The stock market fell.", 0.0),
    ("A cat sleeps.", "A cat is sleeping.", 5.0),
]


def _write_stsb(path, pairs, extra_columns=True):
    lines = []
    for i, (s1, s2, score) in enumerate(pairs):
        row = ["main-captions", "MSRvid", "2012test", f"{i:04d}", f"{score:.3f}", s1, s2]
        if extra_columns and i % 2 == 0:
            row += ["source-a", "source-b"]  # trailing attribution columns: ignored
        lines.append("\t".join(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    for n in (5, 50, 500):
        x = rng.integers(0, 6, n).astype(float)  # many ties, like integer gold scores
        y = x + rng.normal(0, 2, n)
        assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
        assert spearman(y, np.round(y)) == pytest.approx(spearmanr(y, np.round(y)).statistic, abs=1e-12)
    assert np.isnan(spearman(np.ones(4), np.arange(4.0)))


def test_stsb_reader_keeps_quotes_and_ignores_trailing_columns(tmp_path):
    path = tmp_path / "sts-dev.csv"  # the original release: tab-separated despite the name
    _write_stsb(path, PAIRS)
    for fmt in ("auto", "stsb"):
        sts = read_sts(path, fmt)
        assert sts.format == "stsb" and sts.name == "sts-dev"
        assert sts.sentences1 == [p[0] for p in PAIRS] and sts.sentences2 == [p[1] for p in PAIRS]
        assert sts.scores.tolist() == [p[2] for p in PAIRS]
    # what a default CSV reader gets wrong: the quoted sentence must come back verbatim
    assert read_sts(path).sentences1[0] == 'A man said "hello" to the dog.'


def test_cnsd_reader_uses_fields_not_ids(tmp_path):
    path = tmp_path / "cnsd-sts-dev.txt"
    path.write_text(
        "2012test-0000||一个戴着安全帽的男人在跳舞。||一个戴着安全帽的男人在跳舞。||5\n"
        "2012test-0000||一个小孩在骑马。||孩子在骑马。||4\n",  # ids repeat in CNSD
        encoding="utf-8",
    )
    sts = read_sts(path)
    assert sts.format == "cnsd" and len(sts) == 2
    assert sts.sentences2 == ["一个戴着安全帽的男人在跳舞。", "孩子在骑马。"] and sts.scores.tolist() == [
        5.0,
        4.0,
    ]


# PAIRS as a tab-separated file with a header, and as JSON lines.
_HEADED_TSV = "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS)
_JSONL = "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in PAIRS)


def test_header_formats(tmp_path):
    import csv

    csv_path = tmp_path / "pairs.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["score", "sentence1", "sentence2", "extra"])
        for s1, s2, score in PAIRS:
            writer.writerow([score, s1, s2 + ", with a comma", "x"])
    tsv_path = tmp_path / "pairs.tsv"
    tsv_path.write_text(_HEADED_TSV, encoding="utf-8")
    jsonl_path = tmp_path / "pairs.jsonl"
    jsonl_path.write_text(_JSONL, encoding="utf-8")
    got_csv = read_sts(csv_path)
    assert got_csv.format == "csv" and got_csv.sentences2[0] == PAIRS[0][1] + ", with a comma"
    for path, fmt in ((tsv_path, "tsv"), (jsonl_path, "jsonl")):
        sts = read_sts(path)
        assert sts.format == fmt and sts.sentences1 == [p[0] for p in PAIRS]
        assert sts.scores.tolist() == [p[2] for p in PAIRS]


def test_auto_detection_needs_no_format_for_a_misleading_extension(tmp_path):
    """What a format setting was once needed for: a tab-separated header in a .csv or .txt
    file, JSON lines in a .txt file."""
    tsv_in_csv = tmp_path / "pairs.csv"
    tsv_in_csv.write_text(_HEADED_TSV, encoding="utf-8")
    jsonl_in_txt = tmp_path / "pairs.txt"
    jsonl_in_txt.write_text(_JSONL, encoding="utf-8")
    for path, fmt in ((tsv_in_csv, "tsv"), (jsonl_in_txt, "jsonl")):
        sts = read_sts(path)
        assert sts.format == fmt and sts.sentences2 == [p[1] for p in PAIRS]
        assert sts.scores.tolist() == [p[2] for p in PAIRS]


def test_positive_threshold_is_four_fifths_of_the_gold_scale(tmp_path):
    scores = [p[2] for p in PAIRS]  # 0-5, as STS-B and CNSD
    for divisor, threshold in ((1.0, 4.0), (5.0, 0.8), (0.05, 80.0)):  # 0-5, 0-1, 0-100
        path = tmp_path / f"scale-{divisor}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"sentence1": a, "sentence2": b, "score": s / divisor}) + "\n"
                for (a, b, _), s in zip(PAIRS, scores, strict=True)
            ),
            encoding="utf-8",
        )
        sts = read_sts(path)
        assert sts.positive_threshold == pytest.approx(threshold)
        # the same pairs are positives on every scale: gold 4.2 and 5.0 of 0-5
        assert (sts.scores >= sts.positive_threshold).tolist() == [True, False, False, True]


@pytest.mark.parametrize(
    "content, name, message",
    [
        ("a\tb\tc\t1\tfive\tx\ty\n", "bad.csv", "bad.csv:1: score 'five' is not a number"),
        ("id||one||two||high\n", "bad.txt", "bad.txt:1: score 'high' is not a number"),
        ("sentence1,score\nx,1\n", "bad.csv", "no column 'sentence2'"),
        (
            '{"sentence1": "a", "sentence2": "b", "score": "n/a"}\n',
            "bad.jsonl",
            "score 'n/a' is not a number",
        ),
        ("", "empty.jsonl", "no sentence pairs"),
    ],
)
def test_bad_sts_files_name_the_problem(tmp_path, content, name, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_sts(path)
    assert message in str(err.value)


def _independent_spearman(model_dir, pairs):
    """AutoModel + mean pooling + cosine + scipy: shares no code with pipeline.evaluate."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()

    def embed(texts):
        with torch.no_grad():
            batch = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            return ((hidden * mask).sum(1) / mask.sum(1)).numpy()

    a, b = embed([p[0] for p in pairs]), embed([p[1] for p in pairs])
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return 100 * spearmanr(cosine, [p[2] for p in pairs]).statistic


def _generated_pairs(paraphrase_corpus, n, seed):
    texts, groups = paraphrase_corpus
    rng = np.random.default_rng(seed)
    pairs = []
    for k in range(n):
        i = int(rng.integers(len(texts)))
        same = np.flatnonzero(groups == groups[i])
        j = int(rng.choice(same[same != i])) if k % 2 == 0 else int(rng.integers(len(texts)))
        pairs.append((texts[i], texts[j], float(rng.integers(0, 6)) if k % 2 else 4.0 + rng.random()))
    return pairs


def test_evaluate_job_json_and_table(tmp_path, trained_tiny_model_dir, paraphrase_corpus, capfd, monkeypatch):
    """The command once as a process of its own (``--json``), then its ``main()`` here (the
    table, and a bad file's one line): a process costs its imports again."""
    first, second = _generated_pairs(paraphrase_corpus, 120, 0), _generated_pairs(paraphrase_corpus, 80, 1)
    stsb = tmp_path / "dev.csv"
    _write_stsb(stsb, first)
    jsonl = tmp_path / "other.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in second)
    )

    here = ["--model", str(trained_tiny_model_dir)]
    cmd = [PYTHON, str(REPO / "jobs/evaluate.py"), *here]
    one = subprocess.run(cmd + ["--sts", str(stsb), "--json"], env=job_env(), capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    result = json.loads(one.stdout)
    assert result["pairs"] == 120
    assert result["spearman"] == pytest.approx(_independent_spearman(trained_tiny_model_dir, first), abs=0.1)
    assert result["spearman"] > 30  # the trained model ranks same-group pairs above the rest
    assert -4.5 < result["uniformity"] < 0 and 0 <= result["alignment"] <= 4
    # paraphrase retrieval over the same embeddings: the distinct pairs of two different
    # sentences with gold >= 4 are the queries; its values are tested in test_retrieval.py
    assert result["retrieval_queries"] == len({(a, b) for a, b, s in first if s >= 4 and a != b})
    assert 0 <= result["recall_at_1"] <= result["mrr_at_10"] <= 100

    corpus = tmp_path / "corpus.txt"  # post-hoc whitening, fitted on these sentences
    corpus.write_text("\n".join(paraphrase_corpus[0][:400]) + "\n", encoding="utf-8")
    both = run_script_in_process(
        "jobs/evaluate.py", [*here, "--sts", str(stsb), "--sts", str(jsonl), "--whiten-on", str(corpus)],
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert both.returncode == 0, both.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in both.stdout.splitlines()[3:]}
    assert set(rows) == {"dev", "other", "average"}
    expected_other = _independent_spearman(trained_tiny_model_dir, second)
    assert float(rows["other"][2]) == pytest.approx(expected_other, abs=0.1)
    assert float(rows["average"][2]) == pytest.approx((result["spearman"] + expected_other) / 2, abs=0.1)
    assert rows["average"][1] == "200"
    # file, pairs, spearman, whitened, mrr@10, recall@1, alignment, uniformity
    assert all(len(row) == 8 and -100 <= float(row[3]) <= 100 for row in rows.values())

    bad = tmp_path / "bad.csv"
    bad.write_text("a\tb\tc\td\tNaNx\te\tf\n")
    failed = run_script_in_process(
        "jobs/evaluate.py", [*here, "--sts", str(bad)], cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch
    )
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines() == [f"error: {bad}:1: score 'NaNx' is not a number"]
