"""jobs/recipes/prepare.py on small files laid out like ../shared/data (which tests never read)."""

from __future__ import annotations

import json
import subprocess

from conftest import PYTHON, REPO

from bench.common import job_env


def test_prepare_builds_recipe_inputs(tmp_path):
    data = tmp_path / "data"
    (data / "zh-stsb").mkdir(parents=True)
    (data / "zh-stsb/cnsd-sts-train.txt").write_text(
        "a||一个人在跳舞。||有人在跳舞。||4\nb||一个人在跳舞。||猫在睡觉。||0\n"
    )
    (data / "wiki").mkdir()
    (data / "wiki/wiki1m_for_simcse.first11914.txt").write_text("First sentence.\nSecond sentence.\n")
    nli = data / "nli/snli-senteval"
    nli.mkdir(parents=True)
    rows = [  # premise, hypothesis, label; lines end in a space as in SentEval's files
        ("A man runs .", "A person moves .", "entailment"),
        ("A man runs .", "A man sleeps .", "contradiction"),
        ("A man runs .", "A man runs fast .", "neutral"),
        ("Two dogs play .", "Animals play .", "entailment"),  # no contradiction: no triplet
    ]
    (nli / "s1.dev").write_text("".join(f"{p} \n" for p, _, _ in rows))
    (nli / "s2.dev").write_text("".join(f"{h} \n" for _, h, _ in rows))
    (nli / "labels.dev").write_text("".join(f"{label}\n" for _, _, label in rows))

    out = tmp_path / "out"
    proc = subprocess.run(
        [PYTHON, str(REPO / "jobs/recipes/prepare.py"), "--data", str(data), "--out", str(out)],
        env=job_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "cnsd-train-sentences.txt").read_text().splitlines() == [
        "一个人在跳舞。",
        "有人在跳舞。",
        "猫在睡觉。",
    ]
    triplets = [json.loads(line) for line in (out / "snli-dev-triplets.jsonl").read_text().splitlines()]
    assert triplets == [
        {"anchor": "A man runs .", "positive": "A person moves .", "negative": "A man sleeps ."}
    ]
    assert (out / "wiki-sentences.txt").read_text() == "First sentence.\nSecond sentence.\n"
