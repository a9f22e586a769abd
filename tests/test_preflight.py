"""What the job needs from the machine is checked before Ray or MLflow start: each missing
piece is one line naming the key and what to install or change, in seconds."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import PYTHON, REPO

from bench.common import job_env
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.runtime.preflight import preflight_mine, preflight_train

DEMO = str(REPO / "jobs/configs/demo.yaml")


@pytest.fixture
def without_faiss(monkeypatch):
    """``import faiss`` fails as it does after a plain ``pip install -e .``."""
    monkeypatch.setitem(sys.modules, "faiss", None)


def test_missing_faiss_is_named_with_the_extra_only_when_mining_needs_it(without_faiss, tmp_path):
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}"])
    with pytest.raises(
        ConfigError, match=r"mining\.refresh=every_epoch .* needs FAISS.*pip install -e '\.\[cpu\]'"
    ):
        preflight_train(cfg)
    preflight_train(load_config(DEMO, [f"run.output_dir={tmp_path}", "mining.refresh=never"]))
    preflight_train(load_config(DEMO, [f"run.output_dir={tmp_path}", "train.epochs=1"]))  # no refresh
    with pytest.raises(ConfigError, match=r"jobs/mine\.py needs FAISS"):
        preflight_mine(cfg, str(tmp_path / "triplets.parquet"))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_gpu_asked_for_on_a_machine_without_one(tmp_path):
    # In a fresh interpreter: the Ray this test session runs in-process counts as a joined cluster.
    script = f"""
from pipeline.config.loading import load_config
from pipeline.core.errors import ConfigError
from pipeline.runtime.preflight import preflight_train
for setting in ("train.gpus_per_worker=1", "mining.num_gpus=1"):
    try:
        preflight_train(load_config({DEMO!r}, ["run.output_dir={tmp_path}", setting]))
        print("passed:", setting)
    except ConfigError as error:
        print("error:", error)
# Joining a cluster: the GPUs are on its workers, checked against its resources later.
joined = ["run.output_dir={tmp_path}", "train.gpus_per_worker=1", "ray.address=10.0.0.1:6379"]
preflight_train(load_config({DEMO!r}, joined))
print("joined: passed")
"""
    proc = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "joined: passed", proc.stdout
    for line, named in zip(lines[:2], ["train.gpus_per_worker=1", "mining.num_gpus=1"], strict=True):
        assert line.startswith(f"error: {named} but this machine has no usable CUDA device"), line


def test_output_folders_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}", f"run.storage_path={blocker}/checkpoints"])
    with pytest.raises(ConfigError, match=r"^run\.storage_path: .*a-file/checkpoints is not writable"):
        preflight_train(cfg)
    cfg = load_config(DEMO, [f"run.output_dir={blocker}/runs"])
    with pytest.raises(ConfigError, match=r"^run\.output_dir: "):
        preflight_train(cfg)


def test_jobs_without_faiss_stop_before_any_compute(tmp_path):
    """The whole job, as a user without the [cpu] extra runs it: one line, exit 2, no MLflow
    run, no Ray, in seconds (it used to train a whole epoch first)."""
    shadow = tmp_path / "shadow" / "faiss"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'faiss'\", name='faiss')\n"
    )
    env = job_env({"PYTHONPATH": str(shadow.parent)})
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a first sentence\nanother one\n")
    for args in (
        [str(REPO / "jobs/train.py"), "--config", DEMO],
        [
            str(REPO / "jobs/mine.py"),
            "--model",
            str(tmp_path),
            "--input",
            str(sentences),
            "--output",
            "t.parquet",
        ],
    ):
        proc = subprocess.run(
            [PYTHON, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert (
            len(errors) == 1 and "needs FAISS, which is not installed (No module named 'faiss')" in errors[0]
        )
        assert "Traceback" not in proc.stderr and "[data]" not in proc.stdout and "[run]" not in proc.stdout
        assert not (tmp_path / "mlruns.db").exists()
