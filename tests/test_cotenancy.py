"""Jobs beside other Ray work on one machine: each job runs on the Ray it means and leaves
the others alone.

Ray's defaults guess "the" cluster from ``$RAY_TMPDIR/ray/ray_current_cluster`` (written by
``ray start``) or from the running ``gcs_server`` processes. The tests here share one
``RAY_TMPDIR`` with a ``ray start`` head, so a job that let Ray guess would join or query
that head; they do not touch the machine's default ``/tmp/ray``.

The two training jobs there share config and seed, so they also show that a run is
reproducible: the same config and seed give the same run on a local Ray and submitted to a
``ray start`` head. The local one is the demo as a user runs it, everything on
(:mod:`demo_checks` says what its run must be): one whole job fewer for the suite.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, RayHead, assert_clean_negatives
from demo_checks import DEMO_CHECKED, assert_the_demo_run
from mlflow.tracking import MlflowClient

from bench.common import job_env, set_flags
from pipeline.core.seams import CONNECT_TIMEOUT_ENV
from pipeline.runtime.cluster import free_port

DEMO = str(REPO / "jobs/configs/demo.yaml")
# Both training jobs: the demo (1600 sentences, 3 epochs: a random one, then two mined ones)
# with everything on, seed 42 (as set).
SETTINGS = [*DEMO_CHECKED, "run.seed=42"]
# The local job is the demo's run; the submitted one has a name of its own.
RUN_NAMES = {"submitted": "submitted", "local": "demo"}


def _start(cmd: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [PYTHON, *cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _finished_run(db: Path, experiment: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


SUBMITTED_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def jobs_beside_each_other(tmp_path_factory, trained_tiny_model_dir, paraphrase_corpus):
    """All at once on one machine: a ``ray start`` head with the README's ``ray job submit`` of
    jobs/train.py (unchanged) running on it, the same training job with the same config and
    seed on a local Ray of its own beside it, and an offline mining job on a text file (an
    empty line and a repeated sentence in it) whose Ray folder holds a dead cluster's leftovers.
    Yields each job's exit status and output by name."""
    tmp_path = tmp_path_factory.mktemp("cotenancy")
    ray_tmp = Path("/tmp") / f"rtc{free_port()}"  # short: Ray's socket paths have a length limit
    stale_tmp = Path("/tmp") / f"rtd{free_port()}"
    texts, _ = paraphrase_corpus
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join([*texts, "", texts[0]]) + "\n")
    head = None
    jobs: dict[str, subprocess.Popen] = {}
    outputs: dict[str, str] = {}
    try:
        head = RayHead(tmp_path / "head", num_cpus=4, ray_tmpdir=ray_tmp)
        # What Ray's guessing would find (ray start writes it once the head is up).
        deadline = time.monotonic() + 120
        while not (ray_tmp / "ray" / "ray_current_cluster").is_file():
            assert time.monotonic() < deadline, "ray start never wrote ray_current_cluster"
            time.sleep(0.5)
        # A cluster that died without cleaning up: its file points at a port nothing listens on.
        (stale_tmp / "ray").mkdir(parents=True)
        (stale_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")

        submitted = tmp_path / "submitted"
        submitted.mkdir()
        # Ray uploads the working dir without .git: the README's submit line passes the commit.
        runtime_env = json.dumps({"env_vars": {"SIMCSE_GIT_COMMIT": SUBMITTED_COMMIT}})
        jobs["submitted"] = subprocess.Popen(
            [
                str(Path(PYTHON).parent / "ray"), "job", "submit", "--address", head.dashboard,
                "--working-dir", str(REPO), "--runtime-env-json", runtime_env,
                "--", "python", "jobs/train.py", "--config", "jobs/configs/demo.yaml",
                "--set", "run.name=submitted", "--set", f"run.output_dir={submitted / 'runs'}",
                "--set", f"tracking.uri=sqlite:///{submitted / 'mlruns.db'}", *_settings(),
            ],
            cwd=submitted, env=head.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        jobs["local"] = _start(
            [str(REPO / "jobs/train.py"), "--config", DEMO, *_settings()],
            tmp_path / "local", job_env({"RAY_TMPDIR": str(ray_tmp)}),
        )  # fmt: skip
        jobs["mine"] = _start(
            [str(REPO / "jobs/mine.py"), "--model", str(trained_tiny_model_dir), "--input", str(sentences),
             "--output", "out/triplets.parquet", "--set", "mining.num_negatives=2", "--set", "model.pooler=mean"],
            tmp_path / "mine", job_env({"RAY_TMPDIR": str(stale_tmp)}),
        )  # fmt: skip
        started = time.monotonic()
        for name, proc in jobs.items():
            outputs[name] = proc.communicate(timeout=max(60, 900 - (time.monotonic() - started)))[0]
        # The head is still up after all of it.
        with urllib.request.urlopen(f"{head.dashboard}/api/version", timeout=10) as answer:
            assert answer.status == 200
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
        if head is not None:
            head.stop()
        for folder in (ray_tmp, stale_tmp):
            shutil.rmtree(folder, ignore_errors=True)
    yield {name: (jobs[name].returncode, out) for name, out in outputs.items()}, tmp_path


def _settings() -> list[str]:
    return set_flags(SETTINGS)


@pytest.mark.slow
@pytest.mark.job
def test_the_demo_beside_a_submitted_copy_and_a_mining_job(jobs_beside_each_other, paraphrase_corpus):
    """Each job finishes on the Ray it means, each MLflow run is FINISHED, no output has a
    traceback, the two training jobs made the same run, and the local one is the demo's run as
    :mod:`demo_checks` describes it. One test over the jobs (a fixture shared by two tests
    would be made twice when pytest-xdist sends them to different test processes)."""
    finished, tmp_path = jobs_beside_each_other
    for name, (code, out) in finished.items():
        assert code == 0, f"{name}:\n{out[-4000:]}"
        assert "Traceback" not in out and "multiple active Ray instances" not in out, (
            f"{name}:\n{out[-4000:]}"
        )
        assert "Failed to connect to GCS" not in out, f"{name}:\n{out[-4000:]}"
    outputs = {name: out for name, (_, out) in finished.items()}
    assert "succeeded" in outputs["submitted"]
    for name, run_name in RUN_NAMES.items():
        assert f"SimCSE run '{run_name}' finished" in outputs[name]
        assert "batch plans   v0 (random), v1 (mined), v2 (mined)" in outputs[name]
        assert (tmp_path / name / "runs" / run_name / "model" / "config.json").is_file()
        run = _finished_run(tmp_path / name / "mlruns.db", "simcse-demo")
        assert run.info.status == "FINISHED"
    tags = _finished_run(tmp_path / "submitted" / "mlruns.db", "simcse-demo").data.tags
    assert tags["mlflow.source.git.commit"] == SUBMITTED_COMMIT
    assert tags["mlflow.source.name"] == "jobs/train.py"  # the uploaded working dir's script
    assert tags["simcse.git_commit_from"] == "SIMCSE_GIT_COMMIT"
    _assert_the_same_run(tmp_path)
    _assert_the_text_file_mined(tmp_path / "mine", outputs["mine"], paraphrase_corpus[0])
    assert_the_demo_run(tmp_path / "local", outputs["local"])


def _assert_the_text_file_mined(folder: Path, out: str, texts: list[str]) -> None:
    """jobs/mine.py on a text file: each sentence its own positive, two clean negatives, at least
    90% of the sentences written, a parquet file that ``datasets`` loads, a FINISHED run."""
    import pyarrow.parquet as pq
    from datasets import load_dataset

    assert "mined out/triplets.parquet" in out
    assert "too few" in out and "removed: duplicate" in out
    assert "[mining] flat index over" in out  # memory estimate, printed before building
    table = pq.read_table(folder / "out/triplets.parquet")
    assert table.column_names == ["anchor", "positive", "negative_1", "negative_2"]
    rows = table.to_pylist()
    assert all(r["anchor"] == r["positive"] for r in rows)
    assert_clean_negatives(rows, 2)
    assert table.num_rows >= 0.9 * len(texts)
    loaded = load_dataset("parquet", data_files=str(folder / "out/triplets.parquet"), split="train")
    assert loaded.num_rows == table.num_rows
    run = _finished_run(folder / "mlruns.db", "simcse-mining")
    assert run.info.status == "FINISHED" and run.data.metrics["mining/rows_out"] == table.num_rows
    # It encoded here as the training miner does on a CPU: in fp32.
    assert run.data.tags["simcse.mining_dtype"] == "fp32" and "(encoded on cpu in fp32)" in out


def _assert_the_same_run(tmp_path: Path) -> None:
    """The submitted job and the local one, same config and seed, different Rays, at the same
    time: the same tokenizer and starting model, the same batch plans (random and mined), the
    same first-epoch losses and the same starting evaluation, so two runs differ only where
    their configs do."""
    runs = {}
    for name in ("submitted", "local"):
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / name / 'mlruns.db'}")
        runs[name] = (client, _finished_run(tmp_path / name / "mlruns.db", "simcse-demo"))
    for name in ("tokenizer.json", "model.safetensors"):
        first, second = (
            tmp_path / job / "runs" / run / "initial_model" / name for job, run in RUN_NAMES.items()
        )
        assert first.read_bytes() == second.read_bytes(), name
    (_, submitted), (_, local) = runs.values()
    for key in ("plan.fingerprint.epoch_1", "plan.fingerprint.epoch_2", "data.digest"):
        assert submitted.data.tags[key] == local.data.tags[key], key

    def history(name: str, key: str) -> list[tuple[int, float]]:
        client, run = runs[name]
        return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))

    steps_per_epoch = 1600 // 64  # the demo's 1600 sentences, batches of 64
    losses = [history(name, "train/loss")[:steps_per_epoch] for name in runs]
    assert len(losses[0]) == steps_per_epoch and [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
    assert [v for _, v in losses[0]] == pytest.approx([v for _, v in losses[1]], abs=1e-6)
    # The starting model's evaluation (what an issue once saw differ: 87.00 vs 88.28).
    start = [history(name, "eval/sts_generated_sts_spearman")[0] for name in runs]
    assert start[0] == start[1]


def test_a_cluster_that_does_not_answer_fails_in_seconds_with_one_line(tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO],
        cwd=tmp_path, env=job_env({"RAY_ADDRESS": dead, CONNECT_TIMEOUT_ENV: "2"}), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: no Ray cluster answers at RAY_ADDRESS={dead} (Connection refused) after "
        "2s; start it, fix the address, or unset it to start a local Ray"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _finished_run(tmp_path / "mlruns.db", "simcse-demo").info.status == "FAILED"
    # No wall-clock bound: Ray's own client would retry the dead address for many minutes, which
    # the subprocess's 180 s ceiling turns into a failure; the error line names the 2 s wait.
