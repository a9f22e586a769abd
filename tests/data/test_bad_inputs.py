"""The bad-input matrix of jobs/train.py (and the up-front checks jobs/mine.py shares): every
bad input ends in exactly one ``error:`` line on stderr that names the problem (and the config
key), no traceback, a non-zero exit code, and an MLflow run (when one was created) marked
FAILED with the reason in ``simcse.error``.

Inputs rejected before Ray starts run ``main()`` in-process without Ray; inputs that need the
corpus read run in-process on the module's shared local Ray; only the cluster-size check
runs as its own process, since it needs a Ray the job starts itself.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import PYTHON, REPO, run_script_in_process
from mlflow.tracking import MlflowClient

from bench.common import job_env, set_flags

DEMO = str(REPO / "jobs/configs/demo.yaml")
# Small and quick wherever a run gets as far as training.
TINY = ["train.epochs=1", "mining.refresh=never", "train.batch_size=16", "train.num_workers=1"]


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    db: Path
    experiment: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    def run(self):
        """The MLflow run the job created, or None."""
        if not self.db.exists():
            return None
        client = MlflowClient(tracking_uri=f"sqlite:///{self.db}")
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            return None
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) <= 1, [r.info.run_id for r in runs]
        return runs[0] if runs else None


def _train(tmp_path: Path, capfd, monkeypatch, *overrides: str, name: str = "bad") -> Outcome:
    """jobs/train.py's main() in this process, in ``tmp_path``, with its own MLflow store."""
    db = tmp_path / "mlruns.db"
    settings = [
        f"tracking.uri=sqlite:///{db}",
        f"run.output_dir={tmp_path / 'runs'}",
        f"tracking.experiment={name}",
        f"run.name={name}",
        *TINY,
        *overrides,
    ]
    proc = run_script_in_process(
        "jobs/train.py",
        ["--config", DEMO, *set_flags(settings)],
        cwd=tmp_path,
        capfd=capfd,
        monkeypatch=monkeypatch,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr, db, name)


def _assert_failed(outcome: Outcome, code: int, error: str | re.Pattern, run_created: bool) -> None:
    assert outcome.code == code, outcome.stderr[-3000:]
    assert len(outcome.errors) == 1, outcome.stderr[-3000:]
    line = outcome.errors[0]
    if isinstance(error, re.Pattern):
        assert error.fullmatch(line), line
    else:
        assert line == error
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    run = outcome.run()
    if not run_created:
        assert run is None  # failed before the MLflow run (and so before Ray)
        return
    assert run is not None and run.info.status == "FAILED"
    assert run.data.tags["simcse.error"] == line.removeprefix("error: ")


# --- Rejected before the MLflow run or Ray exist --------------------------------------------------


def _sts_with_bad_score(tmp_path: Path) -> Path:
    path = tmp_path / "dev.csv"
    path.write_text("sentence1,sentence2,score\na cat,a kitten,4.5\na dog,a car,high\n")
    return path


def _corpora_without_columns(tmp_path: Path) -> None:
    """Corpora whose header lacks the configured column: found from the header, before Ray."""
    (tmp_path / "corpus.csv").write_text(
        "sentence,label\n" + "".join(f"sentence {i},{i}\n" for i in range(50))
    )
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"sentence": f"sentence {i}"}) + "\n" for i in range(50))
    )
    pq.write_table(
        pa.table({"sentence": [f"sentence {i}" for i in range(50)], "label": range(50)}),
        tmp_path / "corpus.parquet",
    )
    (tmp_path / "pairs.csv").write_text(
        "anchor,answer\n" + "".join(f"question {i},answer {i}\n" for i in range(50))
    )
    (tmp_path / "good-pairs.csv").write_text(
        "anchor,positive\n" + "".join(f"question {i},answer {i}\n" for i in range(50))
    )
    (tmp_path / "questions.csv").write_text(
        "question,positive\n" + "".join(f"question {i},answer {i}\n" for i in range(50))
    )
    (tmp_path / "pairs.jsonl").write_text(
        "".join(json.dumps({"q": f"question {i}", "p": f"answer {i}"}) + "\n" for i in range(50))
    )


PRE_RAY = {
    # case: (overrides with {tmp} for the test's folder, exit code, the error line)
    "missing corpus path": (
        ["data.path={tmp}/missing.txt"],
        1,
        "error: data.path: {tmp}/missing.txt does not exist",
    ),
    "csv without the text column": (
        ["data.path={tmp}/corpus.csv"],
        1,
        "error: data.text_column: column 'text' not in {tmp}/corpus.csv (columns: sentence, label)",
    ),
    "jsonl without the text column": (
        ["data.path={tmp}/corpus.jsonl"],
        1,
        "error: data.text_column: column 'text' not in {tmp}/corpus.jsonl (columns: sentence)",
    ),
    "parquet without the text column": (
        ["data.path={tmp}/corpus.parquet"],
        1,
        "error: data.text_column: column 'text' not in {tmp}/corpus.parquet (columns: sentence, label)",
    ),
    "triplet csv without the positive column": (
        ["data.path={tmp}/pairs.csv", "task=pairs", "mining.batch_sampler=random"],  # demo's knn: corpus only
        1,
        "error: data.positive_column: column 'positive' not in {tmp}/pairs.csv (columns: anchor, answer)",
    ),
    "unknown key": (
        ["train.temprature=0.1"],
        2,
        re.compile(r"error: unknown config key 'train\.temprature' \(known under train: .*temperature.*\)"),
    ),
    "wrong type": (["train.batch_size=abc"], 2, "error: train.batch_size must be an integer (got 'abc')"),
    "zero temperature": (["train.temperature=0"], 2, "error: train.temperature must be > 0 (got 0.0)"),
    "negative temperature": (
        ["train.temperature=-0.5"],
        2,
        "error: train.temperature must be > 0 (got -0.5)",
    ),
    "model folder missing": (
        ["model.name_or_path={tmp}/no-such-model"],
        2,
        "error: model.name_or_path: model folder {tmp}/no-such-model does not exist",
    ),
    "relative model folder missing": (
        ["model.name_or_path=./no-such-model"],
        2,
        "error: model.name_or_path: model folder ./no-such-model does not exist",
    ),
    "teacher folder missing": (
        [
            "task=pairs",
            "data.path={tmp}/good-pairs.csv",
            "mining.batch_sampler=random",
            "mining.teacher.model={tmp}/no-such-teacher",
        ],
        2,
        "error: mining.teacher.model: model folder {tmp}/no-such-teacher does not exist",
    ),
    "distillation without a teacher": (
        [
            "task=pairs",
            "data.path={tmp}/good-pairs.csv",
            "mining.batch_sampler=random",
            "train.distill_weight=1.0",
        ],
        2,
        "error: train.distill_weight needs mining.teacher.model (the scores it distils) (got 1.0)",
    ),
    "a teacher's temperature not above 0": (
        [
            "task=pairs",
            "data.path={tmp}/good-pairs.csv",
            "mining.batch_sampler=random",
            "mining.teacher.temperature=0",
        ],
        2,
        "error: mining.teacher.temperature must be > 0, with mining.teacher.model (got 0.0)",
    ),
    "STS score not a number": (
        ["eval.sts={tmp}/dev.csv"],
        1,
        "error: {tmp}/dev.csv:3: score 'high' is not a number",
    ),
}


@pytest.mark.parametrize("case", list(PRE_RAY))
def test_rejected_before_anything_starts(tmp_path, capfd, monkeypatch, case):
    overrides, code, error = PRE_RAY[case]
    _sts_with_bad_score(tmp_path)
    _corpora_without_columns(tmp_path)
    outcome = _train(tmp_path, capfd, monkeypatch, *(o.format(tmp=tmp_path) for o in overrides))
    if isinstance(error, str):
        error = error.format(tmp=tmp_path)
    _assert_failed(outcome, code, error, run_created=False)


MINE_PRE_RAY = {
    # case: (jobs/mine.py arguments with {tmp}, exit code, the error line)
    "model folder missing": (
        ["--model", "{tmp}/no-such-model", "--input", "{tmp}/good-pairs.csv"],
        2,
        "error: model.name_or_path: model folder {tmp}/no-such-model does not exist",
    ),
    "pairs csv without the anchor column": (
        ["--model", "{tmp}/model", "--input", "{tmp}/questions.csv"],
        1,
        "error: data.anchor_column: column 'anchor' not in {tmp}/questions.csv (columns: question, positive)",
    ),
    "pairs jsonl without the anchor column": (
        ["--model", "{tmp}/model", "--input", "{tmp}/pairs.jsonl"],
        1,
        "error: data.anchor_column: column 'anchor' not in {tmp}/pairs.jsonl (columns: q, p)",
    ),
}


@pytest.mark.parametrize("case", list(MINE_PRE_RAY))
def test_mine_job_rejected_before_anything_starts(tmp_path, capfd, monkeypatch, case):
    """jobs/mine.py runs the same checks as jobs/train.py before its MLflow run and Ray: one
    ``error:`` line in seconds, not after a Ray start and a corpus read."""
    arguments, code, error = MINE_PRE_RAY[case]
    _corpora_without_columns(tmp_path)
    (tmp_path / "good-pairs.csv").write_text("anchor,positive\na cat,a kitten\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")  # passes the model folder check
    db = tmp_path / "mlruns.db"
    argv = [a.format(tmp=tmp_path) for a in arguments]
    argv += ["--output", str(tmp_path / "out.parquet"), "--set", f"tracking.uri=sqlite:///{db}"]
    proc = run_script_in_process("jobs/mine.py", argv, cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    outcome = Outcome(proc.returncode, proc.stdout, proc.stderr, db, "simcse-mining")
    _assert_failed(outcome, code, error.format(tmp=tmp_path), run_created=False)
    assert "[data]" not in outcome.stdout  # the pairs were never read
    assert not (tmp_path / "out.parquet").exists()


def test_only_paths_that_look_local_are_checked_up_front(tmp_path, monkeypatch):
    from pipeline.core.errors import ConfigError
    from pipeline.model.folders import check_model_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    (tmp_path / "weights.bin").write_text("")
    for hub_name in ("bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2", "org/name"):
        check_model_path(hub_name)  # left to the hub loader
    check_model_path("model")
    check_model_path(str(tmp_path / "model"))
    for local in ("/no/such/model", "./nope", "../nope", "~/no-such-model-here", "models/nope", "a/b/c"):
        with pytest.raises(
            ConfigError, match=re.escape(f"model.name_or_path: model folder {local} does not exist")
        ):
            check_model_path(local)
    with pytest.raises(ConfigError, match="model.name_or_path: models is a folder without config.json"):
        check_model_path("models")
    with pytest.raises(ConfigError, match="model.name_or_path: weights.bin is a file"):
        check_model_path("weights.bin")


def test_undecodable_lines_are_split_out_exactly():
    from pipeline.data.utf8 import split_utf8_lines

    good = "naïve café\r\nsecond line\n\nlast"
    assert split_utf8_lines(good.encode()) == (good.splitlines(), None)
    lines, invalid = split_utf8_lines(b"ok one\nbad \xff\xfe here\n\nok \xc3\xa9\r\ntruncated \xc3\n")
    assert lines == ["ok one", "", "", "ok é", ""]
    assert invalid == [False, True, False, False, True]


@pytest.mark.parametrize(
    "data",
    [
        "naïve café\r\nsecond line\n\nthird\rfourth\u2028fifth\x0csixth\nlast".encode(),
        b"ok one\nbad \xff\xfe here\n\nok \xc3\xa9\r\ntruncated \xc3\n\n",
        b"",
    ],
)
def test_a_file_read_a_chunk_at_a_time_gives_the_lines_of_the_whole(data):
    """Every chunk size, so that a cut falls on every byte: inside a character, between
    ``\\r`` and ``\\n``, at an empty line, before the last line without a newline."""
    import io

    from pipeline.data.utf8 import INVALID_UTF8, split_utf8_lines, utf8_line_tables

    lines, invalid = split_utf8_lines(data)
    whole = (lines, invalid or [False] * len(lines))
    for chunk_bytes in range(1, len(data) + 2):
        tables = list(utf8_line_tables(io.BytesIO(data), chunk_bytes))
        got = (
            [t for table in tables for t in table.column("text").to_pylist()],
            [f for table in tables for f in table.column(INVALID_UTF8).to_pylist()],
        )
        assert got == whole, chunk_bytes
        assert len(tables) >= 1


# --- The cluster cannot hold the train workers: an error, not a hang ----------------------------


@pytest.mark.slow
def test_more_workers_than_a_local_cluster_can_place_fails_fast(tmp_path):
    overrides = [
        *TINY,
        "ray.num_cpus=2",
        "train.num_workers=4",
        "train.cpus_per_worker=1",
        "tracking.experiment=too-big",
    ]
    args = [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO, *set_flags(overrides)]
    proc = subprocess.run(args, cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=180)
    outcome = Outcome(proc.returncode, proc.stdout, proc.stderr, tmp_path / "mlruns.db", "too-big")
    _assert_failed(
        outcome,
        2,
        "error: train.num_workers x train.cpus_per_worker + mining.num_cpus = 4 CPUs, but the cluster has 2",
        run_created=True,
    )


# --- Corpus problems, found once Ray Data reads it ----------------------------------------------


def _lines(n: int, prefix: str = "sentence") -> str:
    return "".join(f"{prefix} number {i} of the corpus\n" for i in range(n))


def _write_corpus(tmp_path: Path, case: str) -> Path:
    if case == "empty file":
        path = tmp_path / "empty.txt"
        path.write_text("")
    elif case == "whitespace only":
        path = tmp_path / "blank.txt"
        path.write_text("\n   \n\t\n \r\n")
    elif case == "only undecodable lines":
        path = tmp_path / "latin1.txt"
        path.write_bytes("café au lait\nnaïve\ncrème brûlée\n".encode("latin-1"))
    elif case in ("only duplicates", "smaller than a batch"):
        path = tmp_path / "small.txt"
        path.write_text("the same sentence again\n" * 500 if case == "only duplicates" else _lines(10))
    elif case == "jsonl not UTF-8":  # JSON must be UTF-8: this one fails, unlike text and csv
        path = tmp_path / "latin1.jsonl"
        path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    else:  # parquet whose text column holds numbers
        path = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"text": pa.array(range(50), pa.int64())}), path)
    return path


CORPUS = {
    "empty file": (
        1,
        "error: data.path: {path} has no non-empty sentences "
        "(read 0 rows; dropped 0 empty and 0 exact duplicates; 0 sentences remain)",
    ),
    "whitespace only": (
        1,
        "error: data.path: {path} has no non-empty sentences "
        "(read 4 rows; dropped 4 empty and 0 exact duplicates; 0 sentences remain)",
    ),
    "only undecodable lines": (
        1,
        "error: data.path: {path} has no non-empty sentences "
        "(read 3 rows; dropped 0 empty, 3 not valid UTF-8 and 0 exact duplicates; 0 sentences remain)",
    ),
    # 500 rows but one distinct sentence: less than one global batch
    "only duplicates": (2, re.compile(r"error: train\.batch_size \(16\) is larger than the corpus \(1 .*")),
    "smaller than a batch": (
        2,
        re.compile(r"error: train\.batch_size \(16\) is larger than the corpus \(10 .*"),
    ),
    "jsonl not UTF-8": (
        1,
        "error: data.path: cannot read {path} as jsonl: not valid UTF-8 (invalid continuation byte at byte 28)",
    ),
    "parquet text column of int64": (
        1,
        "error: data.text_column: column 'text' in {path} holds int64, not text (strings)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORPUS))
def test_unusable_corpus_fails_the_run(ray_local, tmp_path, capfd, monkeypatch, case):
    path = _write_corpus(tmp_path, case)
    code, error = CORPUS[case]
    outcome = _train(tmp_path, capfd, monkeypatch, f"data.path={path}")
    if isinstance(error, str):
        error = error.format(path=path)
    _assert_failed(outcome, code, error, run_created=True)
    assert ray_local.is_initialized()  # the job used the running Ray and left it running


@pytest.mark.slow
def test_undecodable_csv_cells_and_text_lines_are_dropped_and_counted(ray_local, tmp_path):
    from pipeline.config.data_section import DataSection
    from pipeline.data.corpus import load_clean_corpus

    good = [f"sentence number {i}" for i in range(20)]
    text = tmp_path / "mixed.txt"
    text.write_bytes(
        "\n".join(good[:10]).encode() + b"\nbad \xff line\n" + "\n".join(good[10:]).encode() + b"\n\xc3\n"
    )
    csv = tmp_path / "mixed.csv"
    csv.write_bytes(b"text,n\n" + b"".join(f"{s},1\n".encode() for s in good) + b"caf\xe9,2\n12345,3\n")
    for path, expected in ((text, good), (csv, [*good, "12345"])):  # csv: a number is still text
        corpus, stats = load_clean_corpus(DataSection(path=str(path)))
        assert sorted(corpus.gather().column("text").to_pylist()) == sorted(expected)
        assert stats.invalid_utf8_dropped == (2 if path == text else 1)
        assert stats.empty_dropped == 0 and stats.rows_read == len(expected) + stats.invalid_utf8_dropped
        assert f"{stats.invalid_utf8_dropped} not valid UTF-8" in stats.describe()


# --- A run that trains although its corpus is dirty (runs last: it takes longest) -------------------


@pytest.mark.slow
@pytest.mark.job
def test_long_lines_are_truncated_and_bad_lines_skipped_and_both_counted(
    ray_local, tmp_path, capfd, monkeypatch, paraphrase_corpus
):
    from transformers import AutoTokenizer

    texts, _ = paraphrase_corpus
    sentences = list(dict.fromkeys(texts))[:200]
    words = " ".join(sentences).split()
    megabyte = []
    size = 0
    while size < 1_000_000:  # a 1 MB line of corpus words: hundreds of thousands of tokens
        word = words[len(megabyte) % len(words)]
        megabyte.append(word)
        size += len(word) + 1
    long_lines = [" ".join(sentences[i : i + 6]) for i in range(0, 24, 6)]  # ~50 words each
    path = tmp_path / "dirty.txt"
    path.write_bytes(
        "\n".join(sentences[:100]).encode()
        + b"\nnot \xff utf-8\n"
        + " ".join(megabyte).encode()
        + b"\n"
        + "\n".join(sentences[100:] + long_lines).encode()
        + b"\n\xe9t\xe9\n"
    )

    outcome = _train(tmp_path, capfd, monkeypatch, f"data.path={path}", name="dirty")
    assert outcome.code == 0, outcome.stderr[-3000:]
    assert outcome.errors == []
    kept = [*sentences, " ".join(megabyte), *long_lines]
    data_line = next(line for line in outcome.stdout.splitlines() if line.startswith(f"[data] {path}:"))
    assert (
        f"read {len(kept) + 2} rows; dropped 0 empty, 2 not valid UTF-8 and 0 exact duplicates" in data_line
    )

    # An independent count: the run's own tokenizer, nothing truncated.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "runs/dirty/initial_model")
    lengths = [len(ids) for ids in tokenizer(kept, truncation=False)["input_ids"]]
    truncated = sum(n > 32 for n in lengths)
    assert truncated >= 1 + len(long_lines) and max(lengths) > 100_000
    tokenized_line = next(line for line in outcome.stdout.splitlines() if line.startswith("[data] tokenized"))
    assert f"[data] tokenized {len(kept)} sentences (max_seq_len 32; {truncated} truncated)" in tokenized_line

    run = outcome.run()
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["data.truncated"] == str(truncated) and tags["data.invalid_utf8_dropped"] == "2"
    assert run.data.params["data/rows"] == str(len(kept))  # one name per fact: no data.sentences tag too
    assert "data.sentences" not in tags


# --- Resources a joined cluster does not have: each wait ends at its configured timeout -----------


@pytest.mark.slow
def test_unplaceable_miner_on_a_joined_cluster_times_out(ray_local, tmp_path, capfd, monkeypatch):
    # A joined cluster may still grow (autoscaler), so the job waits, but only train.placement_timeout_s.
    outcome = _train(
        tmp_path, capfd, monkeypatch, "mining.refresh=every_epoch", "train.epochs=2", "mining.num_gpus=1",
        "train.placement_timeout_s=5",
    )  # fmt: skip
    _assert_failed(
        outcome,
        1,
        "error: the miner actor (mining.num_cpus=0.25, mining.num_gpus=1) was not placed within train.placement_timeout_s=5s",
        run_created=True,
    )


@pytest.mark.slow
def test_unplaceable_train_workers_on_a_joined_cluster_time_out(ray_local, tmp_path, capfd, monkeypatch):
    outcome = _train(tmp_path, capfd, monkeypatch, "train.gpus_per_worker=1", "train.placement_timeout_s=10")
    _assert_failed(
        outcome,
        1,
        re.compile(r"error: the train workers were not placed within train\.placement_timeout_s: .*"),
        run_created=True,
    )


def test_debug_shows_the_traceback(tmp_path):
    proc = subprocess.run(
        [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO, "--debug", "--set", f"data.path={tmp_path}/missing.txt"],
        cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert f"DataError: data.path: {tmp_path}/missing.txt does not exist" in proc.stderr
