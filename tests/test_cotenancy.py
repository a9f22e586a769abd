"""Jobs beside other Ray work on one machine: each job runs on the Ray it means and leaves
the others alone.

Ray's defaults guess "the" cluster from ``$RAY_TMPDIR/ray/ray_current_cluster`` (written by
``ray start``) or from the running ``gcs_server`` processes. The tests here share one
``RAY_TMPDIR`` with a ``ray start`` head, so a job that let Ray guess would join or query
that head; they do not touch the machine's default ``/tmp/ray``.

The two training jobs there share config and seed, so they also show that a run is
reproducible: the same config and seed give the same run on a local Ray and submitted to a
multi-node cluster. The local one is the demo as a user runs it, everything on
(:mod:`demo_checks` says what its run must be): one whole job fewer for the suite.

The submitted one runs as on a KubeRay cluster: a ``ray start`` head with no CPUs (the driver
runs there, no stage does) and two worker nodes that carry the CPUs and do not see the
driver's folders (each in a mount namespace of its own with an empty tmpfs over them): its
generated corpus, its run folder and its sqlite MLflow store are on the driver's disk only, and
Ray Train's storage is a folder every node sees (``run.storage_path``, as a shared mount would
be). Beside it, the same job with its storage on the driver's disk only stops before compute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, RayHead, RayWorkerNode, assert_clean_negatives
from demo_checks import DEMO_CHECKED, assert_the_demo_run
from mlflow.tracking import MlflowClient

from bench.common import job_env, set_flags
from pipeline.core.seams import CONNECT_TIMEOUT_ENV
from pipeline.runtime.cluster import free_port
from pipeline.tracking.refresh_table import read_refresh_table

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


def _submit(head: RayHead, folder: Path, name: str, submission_id: str, *flags: str) -> subprocess.Popen:
    """README's ``ray job submit`` of the demo, run ``name``, its run folder and sqlite store in
    ``folder`` (the driver's disk)."""
    # Ray uploads the working dir without .git: the README's submit line passes the commit.
    runtime_env = json.dumps({"env_vars": {"SIMCSE_GIT_COMMIT": SUBMITTED_COMMIT}})
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            str(Path(PYTHON).parent / "ray"), "job", "submit", "--address", head.dashboard,
            "--submission-id", submission_id, "--working-dir", str(REPO), "--runtime-env-json", runtime_env,
            "--", "python", "jobs/train.py", "--config", "jobs/configs/demo.yaml",
            "--set", f"run.name={name}", "--set", f"run.output_dir={folder / 'runs'}",
            "--set", f"tracking.uri=sqlite:///{folder / 'mlruns.db'}", *flags, *_settings(),
        ],
        cwd=folder, env=head.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _placements(head: RayHead, submission_id: str) -> dict[str, set[str]]:
    """Where the submitted job's processes ran, by Ray's state API (dead actors included): the
    node ids of its driver and of each of its actor classes, and the cluster's nodes by name."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    with head.addressed():
        job = JobSubmissionClient(head.dashboard).get_job_info(submission_id)
        actors = list_actors(address=head.dashboard, filters=[("job_id", "=", job.job_id)], limit=1000)
    placed: dict[str, set[str]] = {"driver": {job.driver_node_id}}
    for actor in actors:
        placed.setdefault(actor.class_name, set()).add(actor.node_id)
    placed.update({f"node:{name}": {node} for name, node in head.node_ids().items()})
    return placed


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
    nodes: list[RayWorkerNode] = []
    jobs: dict[str, subprocess.Popen] = {}
    outputs: dict[str, str] = {}
    placements: dict[str, set[str]] = {}
    # The driver's disk: folders the worker nodes do not see.
    driver_only = (tmp_path / "submitted", tmp_path / "blind")
    for folder in driver_only:
        folder.mkdir()
    submission = f"simcse-multinode-{free_port()}"
    try:
        head = RayHead(tmp_path / "head", num_cpus=0, ray_tmpdir=ray_tmp)
        nodes = [RayWorkerNode(head, name, num_cpus=2, hidden=driver_only) for name in ("a", "b")]
        # What Ray's guessing would find (ray start writes it once the head is up).
        deadline = time.monotonic() + 120
        while not (ray_tmp / "ray" / "ray_current_cluster").is_file():
            assert time.monotonic() < deadline, "ray start never wrote ray_current_cluster"
            time.sleep(0.5)
        # A cluster that died without cleaning up: its file points at a port nothing listens on.
        (stale_tmp / "ray").mkdir(parents=True)
        (stale_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")

        shared = tmp_path / "shared-storage"  # what every node mounts
        jobs["submitted"] = _submit(
            head, tmp_path / "submitted", "submitted", submission, "--set", f"run.storage_path={shared}"
        )
        # Storage left at run.output_dir: the driver's disk only.
        jobs["blind"] = _submit(head, tmp_path / "blind", "blind", f"{submission}-blind")
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
        placements = _placements(head, submission)
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
        for node in nodes:
            node.stop()
        if head is not None:
            head.stop()
        for folder in (ray_tmp, stale_tmp):
            shutil.rmtree(folder, ignore_errors=True)
    yield {name: (jobs[name].returncode, out) for name, out in outputs.items()}, tmp_path, placements


def _settings() -> list[str]:
    return set_flags(SETTINGS)


@pytest.mark.slow
@pytest.mark.job
def test_the_demo_beside_a_submitted_copy_and_a_mining_job(jobs_beside_each_other, paraphrase_corpus):
    """Each job finishes on the Ray it means, each MLflow run is FINISHED, no output has a
    traceback, the two training jobs made the same run, and the local one is the demo's run as
    :mod:`demo_checks` describes it. One test over the jobs (a fixture shared by two tests
    would be made twice when pytest-xdist sends them to different test processes)."""
    finished, tmp_path, placements = jobs_beside_each_other
    _assert_storage_on_the_drivers_disk_only_stops_the_job(tmp_path / "blind", *finished.pop("blind"))
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
    _assert_placed_off_the_drivers_node(placements, outputs["submitted"])
    _assert_the_text_file_mined(tmp_path / "mine", outputs["mine"], paraphrase_corpus[0])
    assert_the_demo_run(tmp_path / "local", outputs["local"])


def _assert_storage_on_the_drivers_disk_only_stops_the_job(folder: Path, code: int, out: str) -> None:
    """Storage the worker nodes do not see: one line naming run.storage_path and what to give,
    before any data is read; the MLflow run FAILED, what was written kept (resolved config)."""
    assert code != 0, out[-4000:]
    # ray job submit prints the job's log as it runs, and its end again with the failure.
    errors = sorted({line for line in out.splitlines() if line.startswith("error:")})
    assert len(errors) == 1, out[-4000:]
    assert errors[0].startswith(
        f"error: run.storage_path (unset: run.output_dir): {folder / 'runs'} is not the same folder on every Ray node (node "
    )
    assert errors[0].endswith(
        "does not see the file the driver wrote there, 2 of 3 nodes); Ray Train's workers write "
        "checkpoints there: give a URI (s3://, gs://) or a path every node mounts"
    ), errors[0]
    assert "[data]" not in out and "Traceback" not in out
    run = _finished_run(folder / "mlruns.db", "simcse-demo")
    assert run.info.status == "FAILED" and "run.storage_path" in run.data.tags["simcse.error"]
    assert (folder / "runs" / "blind" / "resolved_config.yaml").is_file()
    assert not list((folder / "runs").glob(".simcse-storage-probe-*"))  # the probe is removed


def _assert_placed_off_the_drivers_node(placements: dict[str, set[str]], out: str) -> None:
    """The driver on the head (no CPUs), every train worker and the miner on the worker nodes,
    the tracking relay beside the driver: read from Ray's state API, not from the config. The
    generated corpus, on the driver's disk only, was read there."""
    head, workers = placements["node:head"], placements["node:a"] | placements["node:b"]
    assert placements["driver"] == head
    assert placements["RayTrainWorker"] and placements["RayTrainWorker"] <= workers
    assert placements["HardNegativeMinerActor"] and placements["HardNegativeMinerActor"] <= workers
    assert placements["TrackingRelay"] == head
    assert "is on the driver's disk only (2 of 3 nodes do not see it): read on the driver's node" in out


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
    """The submitted job (three nodes, its store on the driver's disk only) and the local one
    (one node), same config and seed, at the same time: the same tokenizer and starting model,
    the same batch plans (random and mined), the same first-epoch losses, the same evaluations
    and exported score, and the same MLflow run (metric keys, refresh table, artifacts, logged
    model) but for the system metrics of the nodes the workers ran on."""
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
    # Every evaluation and the exported score: the same plans and steps, float sums in another
    # order at most.
    evaluations = [history(name, "eval/sts_generated_sts_spearman") for name in runs]
    assert [s for s, _ in evaluations[0]] == [s for s, _ in evaluations[1]]
    assert [v for _, v in evaluations[0]] == pytest.approx([v for _, v in evaluations[1]], abs=0.05)
    assert submitted.data.metrics["best/score"] == pytest.approx(local.data.metrics["best/score"], abs=0.05)

    def logged(name: str) -> tuple[set[str], list[tuple[float, float]], set[str]]:
        client, run = runs[name]
        run_id = run.info.run_id
        keys = {k for k in run.data.metrics if not k.startswith("system/")}
        refreshes = [(r["step"], r["plan_version"]) for r in read_refresh_table(client, run_id)]
        files = {a.path for folder in ("", "mining", "review") for a in client.list_artifacts(run_id, folder)}
        assert client.search_logged_models(experiment_ids=[run.info.experiment_id]), name
        return keys, refreshes, files

    assert logged("submitted") == logged("local")
    assert len(logged("submitted")[1]) == 2  # both refreshes in the submitted run's table


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
