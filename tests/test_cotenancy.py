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
be). It is submitted as the KubeRay RayJob submits it: the manifest's entrypoint string, its
``$VARS`` given in the job's environment. The train workers go to nodes labelled
``role=trainer``, the miner to ``role=miner`` (``train.label_selector``,
``mining.label_selector``), and both are lost on purpose: the miner's node while it computes
the first refresh, the workers' node in the middle of epoch 2, each replaced by a fresh node,
as an autoscaler replaces a preempted machine. Beside it, the same job with its storage on the
driver's disk only stops before compute.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import (
    PYTHON,
    REPO,
    assert_clean_negatives,
    fatal_signal_pid,
    keep_ray_logs,
    unexpected_alarming_lines,
)
from demo_checks import DEMO_CHECKED, assert_the_demo_run
from mlflow.tracking import MlflowClient
from test_kuberay_manifest import rayjob_entrypoint

from bench.common import job_env, set_flags
from bench.local_cluster import RayHead, RayWorkerNode
from bench.running_job import JOB_PATIENCE_S, held_pid, snapshot_checkpoints, wait_for
from pipeline.core.seams import CONNECT_TIMEOUT_ENV, HOLD_DIR_ENV, HOLD_ENV
from pipeline.runtime.cluster import free_port
from pipeline.tracking.refresh_table import read_refresh_table

DEMO = str(REPO / "jobs/configs/demo.yaml")
# Both training jobs: the demo (1600 sentences, 3 epochs: a random one, then two mined ones)
# with everything on, seed 42 (as set).
SETTINGS = [*DEMO_CHECKED, "run.seed=42"]
# The local job is the demo's run; the submitted one has a name of its own.
RUN_NAMES = {"submitted": "submitted", "local": "demo"}


def _start(cmd: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """A job whose output goes to ``cwd/job.log`` (a pipe nobody reads while the test moves
    nodes would fill and stall it)."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=(cwd / "job.log").open("w"), stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _finished_run(db: Path, experiment: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


SUBMITTED_COMMIT = "0123456789abcdef0123456789abcdef01234567"

# Where the submitted job's stages may run (Ray node labels the worker nodes carry).
PLACEMENT = ["train.label_selector.role=trainer", "mining.label_selector.role=miner"]
# The demo's 1600 rows in batches of 64: 25 steps an epoch, checkpoints every 10 steps
# (DEMO_CHECKED). Rank 0 is held before step 36 and its node lost there: the run resumes at 30.
STEPS_PER_EPOCH, MID_EPOCH_CHECKPOINT, LOST_BEFORE_STEP = 25, 30, 36
NODE_LOSS_HOLDS = ("miner_refresh=1", f"train_step={LOST_BEFORE_STEP}")


def _submit(
    head: RayHead,
    folder: Path,
    *,
    name: str,
    submission_id: str,
    storage: Path,
    settings: list[str] = SETTINGS,
    env: dict | None = None,
) -> subprocess.Popen:
    """``ray job submit`` of the KubeRay RayJob's entrypoint as written in
        deploy/kuberay/rayjob.yaml, run through a shell as KubeRay's submitter pod runs it, with the
        ConfigMap's variables in that shell's environment: the demo config, run ``name``, its run
        folder in ``folder`` (the driver's disk), Ray Train's storage in ``storage``, ``settings``
    (the demo's as the local job's, by default). The sqlite
        store in ``folder`` reaches the driver as MLFLOW_TRACKING_URI (the head pod's environment
        on KubeRay); ``env`` goes to the job as well."""
    submitter_env = {
        **head.env,
        "SIMCSE_CONFIG": "jobs/configs/demo.yaml",
        "SIMCSE_STORAGE_PATH": str(storage),
        "SIMCSE_OUTPUT_DIR": str(folder / "runs"),
        "SIMCSE_SETTINGS": shlex.join(set_flags([f"run.name={name}", *PLACEMENT, *settings])),
    }
    job_env_vars = {
        # Ray uploads the working dir without .git: the RayJob passes the commit.
        "SIMCSE_GIT_COMMIT": SUBMITTED_COMMIT,
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlruns.db'}",
        **(env or {}),
    }
    submit = shlex.join([
        str(Path(PYTHON).parent / "ray"), "job", "submit", "--address", head.dashboard,
        "--submission-id", submission_id, "--working-dir", str(REPO),
        "--runtime-env-json", json.dumps({"env_vars": job_env_vars}), "--",
    ])  # fmt: skip
    return _start(["sh", "-c", f"{submit} {rayjob_entrypoint()}"], folder, submitter_env)


def _placements(head: RayHead, submission_id: str, named: dict[str, str]) -> dict[str, set[str]]:
    """Where the submitted job's processes ran, by Ray's state API (dead actors included): the
    node ids of its driver and of each of its actor classes (a restarted actor: where it runs
    last), and the ``named`` nodes (lost ones included)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    with head.addressed():
        job = JobSubmissionClient(head.dashboard).get_job_info(submission_id)
        actors = list_actors(
            address=head.dashboard,
            filters=[("job_id", "=", job.job_id)],
            limit=1000,
            raise_on_missing_output=False,
        )
    placed: dict[str, set[str]] = {"driver": {job.driver_node_id}}
    for actor in actors:
        placed.setdefault(actor.class_name, set()).add(actor.node_id)
    placed.update({f"node:{name}": {node} for name, node in named.items()})
    return placed


@pytest.fixture(scope="module")
def jobs_beside_each_other(
    tmp_path_factory, trained_tiny_model_dir, tiny_model_dir, paraphrase_corpus, paraphrase_pairs
):
    """All at once on one machine: a ``ray start`` head with the RayJob's entrypoint submitted
    to it (its nodes lost and replaced on the way, :func:`_lose_and_replace_nodes`), the same
    training job with the same config and seed on a local Ray of its own beside it, and an
    offline mining job on a text file (an empty line and a repeated sentence in it) whose Ray
    folder holds a dead cluster's leftovers. Yields each job's exit status and output by name,
    the folder, and where the submitted job's processes ran."""
    tmp_path = tmp_path_factory.mktemp("cotenancy")
    ray_tmp = Path("/tmp") / f"rtc{free_port()}"  # short: Ray's socket paths have a length limit
    stale_tmp = Path("/tmp") / f"rtd{free_port()}"
    texts, _ = paraphrase_corpus
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join([*texts, "", texts[0]]) + "\n")
    head = None
    nodes: dict[str, RayWorkerNode] = {}
    named: dict[str, str] = {}  # node ids by name, of the lost nodes too
    jobs: dict[str, subprocess.Popen] = {}
    placements: dict[str, set[str]] = {}
    healthy = False  # every job ended, and the local one printed nothing alarming nor a fatal signal
    # The driver's disk: folders the worker nodes do not see.
    driver_only = (tmp_path / "submitted", tmp_path / "blind", tmp_path / "pairs")
    for folder in driver_only:
        folder.mkdir()
    shared = tmp_path / "shared-storage"  # what every node mounts
    holds = shared / "holds"
    holds.mkdir(parents=True)
    submission = f"simcse-multinode-{free_port()}"

    def add_nodes(**roles: str) -> None:
        """A worker node per name, labelled with its role, started at once; back when all joined."""
        for name, role in roles.items():
            nodes[name] = RayWorkerNode(
                head, name, num_cpus=2, labels={"role": role}, hidden=driver_only, join=False
            )
        for name in roles:
            nodes[name].wait_joined()
        named.update(head.node_ids())

    try:
        head = RayHead(tmp_path / "head", num_cpus=0, ray_tmpdir=ray_tmp)
        add_nodes(a="trainer", b="miner")
        # What Ray's guessing would find (ray start writes it once the head is up).
        deadline = time.monotonic() + 120
        while not (ray_tmp / "ray" / "ray_current_cluster").is_file():
            assert time.monotonic() < deadline, "ray start never wrote ray_current_cluster"
            time.sleep(0.5)
        # A cluster that died without cleaning up: its file points at a port nothing listens on.
        (stale_tmp / "ray").mkdir(parents=True)
        (stale_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")

        jobs["submitted"] = _submit(
            head, tmp_path / "submitted", name="submitted", submission_id=submission, storage=shared,
            env={HOLD_ENV: ",".join(NODE_LOSS_HOLDS), HOLD_DIR_ENV: str(holds)},
        )  # fmt: skip
        # Storage left on the driver's disk.
        jobs["blind"] = _submit(
            head, tmp_path / "blind", name="blind", submission_id=f"{submission}-blind",
            storage=tmp_path / "blind" / "runs",
        )  # fmt: skip
        (tmp_path / "local-temp").mkdir()  # the local job's node's temp folder: what it leaves there
        jobs["local"] = _start(
            [PYTHON, str(REPO / "jobs/train.py"), "--config", DEMO, *_settings()],
            tmp_path / "local", job_env({"RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(tmp_path / "local-temp")}),
        )  # fmt: skip
        jobs["mine"] = _start(
            [PYTHON, str(REPO / "jobs/mine.py"), "--model", str(trained_tiny_model_dir), "--input", str(sentences),
             "--output", "out/triplets.parquet", "--set", "mining.num_negatives=2", "--set", "model.pooler=mean"],
            tmp_path / "mine", job_env({"RAY_TMPDIR": str(stale_tmp)}),
        )  # fmt: skip
        lost = _lose_and_replace_nodes(
            head, nodes, add_nodes, jobs["submitted"], holds=holds, run_dir=shared / "submitted"
        )
        # The pairs run on the cluster as the losses left it (nothing of it is lost).
        jobs["pairs"] = _submit(
            head, tmp_path / "pairs", name="pairs", submission_id=f"{submission}-pairs", storage=shared,
            settings=_pairs_settings(tmp_path / "pairs", paraphrase_pairs, paraphrase_corpus[0], tiny_model_dir),
        )  # fmt: skip
        started = time.monotonic()
        for proc in jobs.values():
            proc.wait(timeout=max(60, 900 - (time.monotonic() - started)))
        # The head is still up after all of it.
        with urllib.request.urlopen(f"{head.dashboard}/api/version", timeout=10) as answer:
            assert answer.status == 200
        placements = _placements(head, submission, named)
        pairs_placed = _placements(head, f"{submission}-pairs", named)
        placements.update({f"lost:{name}": ids for name, ids in lost.items()})
        local_log = (tmp_path / "local" / "job.log").read_text(errors="replace")
        # A fatal-signal report is checked against the worker's Ray log after this folder is gone.
        healthy = not unexpected_alarming_lines(local_log) and not any(
            fatal_signal_pid(line) for line in local_log.splitlines()
        )
    finally:
        for proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
        if not healthy:
            # The local demo's Ray and the head keep their sessions in ray_tmp, removed below.
            kept = keep_ray_logs(ray_tmp / "ray", tmp_path / "ray-logs")
            print(f"Ray's logs (the local job's Ray, the head) kept in {kept}")
        for worker_node in nodes.values():
            worker_node.stop()
        if head is not None:
            head.stop()
        for folder in (ray_tmp, stale_tmp):
            shutil.rmtree(folder, ignore_errors=True)
    outputs = {name: (tmp_path / name / "job.log").read_text() for name in jobs}
    placements.update({f"pairs:{key}": nodes_ for key, nodes_ in pairs_placed.items()})
    yield {name: (jobs[name].returncode, out) for name, out in outputs.items()}, tmp_path, placements


# The pairs run: 300 (anchor, positive) pairs of paraphrases, a pool of every generated
# sentence, negatives mined with the starting weights and again after epoch 1.
PAIRS_EPOCHS = 2


def _pairs_settings(
    folder: Path, pairs: tuple[list[str], list[str]], texts: list[str], model: Path
) -> list[str]:
    """A small pairs run's settings; its pairs file and pool in ``folder``, the driver's disk."""
    anchors, positives = pairs
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pairs.jsonl").write_text(
        "".join(
            json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in zip(anchors, positives, strict=True)
        )
    )
    (folder / "pool.txt").write_text("\n".join(texts) + "\n")
    return [
        "task=pairs", f"data.path={folder / 'pairs.jsonl'}", f"data.pool={folder / 'pool.txt'}",
        f"model.name_or_path={model}", "mining.batch_sampler=random", "mining.num_negatives=1",
        "mining.refresh=every_epoch", f"train.epochs={PAIRS_EPOCHS}", "train.num_workers=1", "run.seed=42",
    ]  # fmt: skip


def _lose_and_replace_nodes(
    head: RayHead,
    nodes: dict[str, RayWorkerNode],
    add_nodes,
    job: subprocess.Popen,
    *,
    holds: Path,
    run_dir: Path,
) -> dict[str, set[str]]:
    """Lose the node that holds the miner while it computes refresh v1 (held there by the
    seam) and add a fresh ``role=miner`` node; then, before step 36 (rank 0 held there, the
    checkpoint at step 30 registered), lose the node that holds the train workers and the
    restarted miner's node at once, and add a fresh node for each role. After that no worker
    node is left that tokenized the corpus or fetched it: the restarts must find it on the
    driver's node. The held processes die with their nodes (SIGKILL to every process of the
    node, no warning). Returns the node ids of the miner and of the train workers when their
    nodes were lost."""

    def held(point: str) -> int | None:
        assert job.poll() is None, "the submitted job ended before its nodes were lost"
        return held_pid(holds, point)

    ids = head.node_ids()
    lost: dict[str, set[str]] = {}
    wait_for(lambda: held("miner_refresh=1"), JOB_PATIENCE_S, "the miner held in refresh v1")
    lost["miner"] = head.alive_on("HardNegativeMinerActor")
    assert lost["miner"] == {ids["b"]}, (lost, ids)  # mining.label_selector: the role=miner node
    nodes["b"].lose()
    add_nodes(c="miner")

    wait_for(
        lambda: held(f"train_step={LOST_BEFORE_STEP}"),
        JOB_PATIENCE_S,
        f"rank 0 held before step {LOST_BEFORE_STEP}",
    )
    # Ray Train registers a reported checkpoint a moment later; nothing newer can land while held.
    wait_for(
        lambda: (c := snapshot_checkpoints(run_dir)) and c[-1]["step"] == MID_EPOCH_CHECKPOINT,
        JOB_PATIENCE_S, f"the checkpoint at step {MID_EPOCH_CHECKPOINT} registered",
    )  # fmt: skip
    lost["workers"] = head.alive_on("RayTrainWorker")
    assert lost["workers"] == {ids["a"]}, (lost, ids)  # train.label_selector: the role=trainer node
    lost["miner again"] = head.alive_on("HardNegativeMinerActor")
    nodes["a"].lose()
    nodes["c"].lose()
    add_nodes(d="trainer", e="miner")
    return lost


def _settings() -> list[str]:
    return set_flags(SETTINGS)


@pytest.mark.slow
@pytest.mark.job
def test_the_demo_beside_a_submitted_copy_and_a_mining_job(
    jobs_beside_each_other, paraphrase_corpus, paraphrase_pairs
):
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
    _assert_the_same_run(tmp_path, outputs["submitted"])
    _assert_the_pairs_run_mined_every_epoch(
        tmp_path / "pairs", outputs["pairs"], placements, len(paraphrase_pairs[0])
    )
    _assert_placed_off_the_drivers_node(placements, outputs["submitted"])
    _assert_the_text_file_mined(tmp_path / "mine", outputs["mine"], paraphrase_corpus[0])
    assert_the_demo_run(tmp_path / "local", outputs["local"])
    # Its train workers and miner shard each unpacked the model, and rank 0 kept the best one:
    # none of those copies outlives the job.
    assert not [p.name for p in (tmp_path / "local-temp").iterdir() if p.name.startswith("simcse-")]


def _assert_storage_on_the_drivers_disk_only_stops_the_job(folder: Path, code: int, out: str) -> None:
    """Storage the worker nodes do not see: one line naming run.storage_path and what to give,
    before any data is read; the MLflow run FAILED, what was written kept (resolved config)."""
    assert code != 0, out[-4000:]
    # ray job submit prints the job's log as it runs, and its end again with the failure.
    errors = sorted({line for line in out.splitlines() if line.startswith("error:")})
    assert len(errors) == 1, out[-4000:]
    assert errors[0].startswith(
        f"error: run.storage_path: {folder / 'runs'} is not the same folder on every Ray node (node "
    )
    # Every node but the driver's (the head) is blind to it.
    blind = re.search(
        r"does not see the file the driver wrote there, (\d+) of (\d+) nodes\); Ray Train's workers write "
        r"checkpoints there: give a URI \(s3://, gs://\) or a path every node mounts$",
        errors[0],
    )
    assert blind and int(blind[1]) == int(blind[2]) - 1, errors[0]
    assert "[data]" not in out and "Traceback" not in out
    run = _finished_run(folder / "mlruns.db", "simcse-demo")
    assert run.info.status == "FAILED" and "run.storage_path" in run.data.tags["simcse.error"]
    assert (folder / "runs" / "blind" / "resolved_config.yaml").is_file()
    assert not list((folder / "runs").glob(".simcse-storage-probe-*"))  # the probe is removed


def _assert_placed_off_the_drivers_node(placements: dict[str, set[str]], out: str) -> None:
    """The driver on the head (no CPUs), the tracking relay beside it; the train workers on the
    ``role=trainer`` node, then (that node lost) on the fresh one; the miner on the
    ``role=miner`` node, then (that node lost) restarted on the fresh one: read from Ray's state
    API, not from the config. The generated corpus, on the driver's disk only, was read there."""
    head = placements["node:head"]
    assert placements["driver"] == head and placements["TrackingRelay"] == head
    assert placements["lost:workers"] == placements["node:a"]
    assert placements["RayTrainWorker"] == placements["node:a"] | placements["node:d"]
    assert placements["lost:miner"] == placements["node:b"]
    assert placements["lost:miner again"] == placements["node:c"]
    assert placements["HardNegativeMinerActor"] == placements["node:e"]
    assert "is on the driver's disk only (2 of 3 nodes do not see it): read on the driver's node" in out


def _assert_the_pairs_run_mined_every_epoch(folder: Path, out: str, placements: dict, rows: int) -> None:
    """The pairs run on the cluster the losses left: its pairs file and pool (on the driver's
    disk only) read on the driver's node, negatives mined with the starting weights and again
    after epoch 1, on the fresh nodes; a FINISHED run with both refreshes and a model."""
    assert "succeeded" in out and "SimCSE run 'pairs' finished" in out
    for key, name in (("data.path", "pairs.jsonl"), ("data.pool", "pool.txt")):
        assert (
            f"[data] {key}: {folder / name} is on the driver's disk only (2 of 3 nodes do not see it)" in out
        )
    assert f"{rows} (anchor, positive) rows" in out
    assert "negatives mined with the starting weights: plan v1" in out
    assert (folder / "runs" / "pairs" / "model" / "config.json").is_file()
    assert placements["pairs:driver"] == placements["node:head"]
    assert placements["pairs:RayTrainWorker"] == placements["node:d"]
    assert placements["pairs:HardNegativeMinerActor"] == placements["node:e"]
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlruns.db'}")
    run = _finished_run(folder / "mlruns.db", "simcse-demo")
    assert run.info.status == "FINISHED" and run.data.params["task"] == "pairs"
    steps_per_epoch = -(-rows // 64)
    table = read_refresh_table(client, run.info.run_id)
    assert [(r["step"], r["plan_version"]) for r in table] == [(0, 1.0), (steps_per_epoch, 2.0)]
    # After an epoch most anchors find a negative below their positive's margin.
    assert table[-1]["anchors_short"] < rows
    versions = client.get_metric_history(run.info.run_id, "train/plan_version")
    assert [m.value for m in sorted(versions, key=lambda m: m.step)] == [1.0, 2.0]


def _assert_the_text_file_mined(folder: Path, out: str, texts: list[str]) -> None:
    """jobs/mine.py on a text file: each sentence its own positive, two clean negatives, at least
    90% of the sentences written, a parquet file that ``datasets`` loads, a FINISHED run."""
    import pyarrow.parquet as pq
    from datasets import load_dataset

    assert "mined out/triplets.parquet" in out
    assert "too few" in out and "removed: duplicate" in out
    assert "[mining] v1: flat index over" in out  # the index's memory, as a training refresh says it
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


def _assert_the_same_run(tmp_path: Path, out: str) -> None:
    """The submitted job (its store on the driver's disk only, two of its nodes lost) and the
    local one (one node, nothing lost), same config and seed, at the same time: the same
    tokenizer and starting model, the same batch plans (random and mined: the restarted miner
    re-mined the same plan), the same first-epoch losses, every step trained and only those
    after the last checkpoint twice, identically, the same evaluations and exported score
    (within the chaos check's tolerance, 0.05), and the same MLflow run (metric keys, refresh
    table, artifacts, logged model) but for the system metrics of the nodes the workers ran on
    and the two restarts it records. ``out``: the submitted job's output."""
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

    steps_per_epoch = STEPS_PER_EPOCH
    losses = [history(name, "train/loss")[:steps_per_epoch] for name in runs]
    assert len(losses[0]) == steps_per_epoch and [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
    assert [v for _, v in losses[0]] == pytest.approx([v for _, v in losses[1]], abs=1e-6)
    # The workers' node lost before step 36: resumed at the checkpoint at 30 on the fresh node,
    # steps 31-35 trained twice, the same both times (plan, weights and RNG states restored).
    everything = history("submitted", "train/loss")
    assert {s for s, _ in everything} == set(range(1, 3 * steps_per_epoch + 1))
    twice = sorted({s for s, _ in everything if sum(1 for t, _ in everything if t == s) > 1})
    assert twice == list(range(MID_EPOCH_CHECKPOINT + 1, LOST_BEFORE_STEP))
    for step in twice:
        first, again = (v for s, v in everything if s == step)
        assert first == pytest.approx(again, abs=1e-6), step
    assert f"[train] resumed at step {MID_EPOCH_CHECKPOINT}, in epoch 2 after batch" in out
    assert re.search(r"\[train\] worker rank \d failed: .+ \(failure 1, train\.max_failures=3; ", out), out[
        -4000:
    ]
    # The miner's node lost during refresh v1: restarted on the fresh node, it re-mined; its
    # node lost again in epoch 2, it was restarted again for refresh v2.
    assert "[mining] the miner actor died during refresh v1" in out
    assert re.search(
        r"\[mining\] the miner actor died (during refresh v2 |between refreshes \(refresh v2 ).*; restart 2/3",
        out,
    )
    assert "the miner actor was restarted 2x" in out
    # The MLflow run records the restarts.
    restarts = history("submitted", "mining/miner_restarts")
    assert [v for _, v in restarts] == [1.0, 2.0] and restarts[0][0] == steps_per_epoch, restarts
    assert history("submitted", "train/resumed_at_step") == [
        (MID_EPOCH_CHECKPOINT, float(MID_EPOCH_CHECKPOINT))
    ]
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
        # Restarts, and the churn of refresh v2: a miner restarted since v1 has no v1 to
        # measure it against (asserted below).
        restarts = {"mining/miner_restarts", "train/resumed_at_step", "mining/churn"}
        keys = {k for k in run.data.metrics if not k.startswith("system/") and k not in restarts}
        refreshes = [(r["step"], r["plan_version"]) for r in read_refresh_table(client, run_id)]
        files = {a.path for folder in ("", "mining", "review") for a in client.list_artifacts(run_id, folder)}
        assert client.search_logged_models(experiment_ids=[run.info.experiment_id]), name
        return keys, refreshes, files

    assert logged("submitted") == logged("local")
    assert "mining/churn" in local.data.metrics and "mining/churn" not in submitted.data.metrics
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
