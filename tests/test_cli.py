"""The jobs' command lines as a user meets them: no arguments, --help, the shared job_main."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO

from bench.common import job_env
from pipeline.runtime.cli import EXIT_CONFIG, config_summary, job_main

SHIPPED = sorted(path.name for path in (REPO / "jobs/configs").glob("*.yaml"))


def _job(tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, str(REPO / "jobs" / script), *args],
        cwd=tmp_path,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_without_arguments_shows_the_configs_and_creates_nothing(tmp_path):
    done = _job(tmp_path, "train.py")
    assert done.returncode == EXIT_CONFIG == 2, done.stderr[-2000:]
    assert done.stdout == ""
    usage = done.stderr
    assert usage.startswith("usage: train.py")
    assert "--config FILE" in usage and "jobs/configs/" in usage
    assert len(SHIPPED) >= 6 and "your-corpus.yaml" in SHIPPED
    for name in SHIPPED:
        line = next(line for line in usage.splitlines() if f"jobs/configs/{name}" in line)
        assert config_summary(REPO / "jobs/configs" / name) in line  # its one-line description
    assert "--config" in usage.splitlines()[-1] and "demo.yaml" in usage.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []  # no runs/, no mlruns.db, nothing


def test_train_help_lists_the_configs_and_the_common_invocations(tmp_path):
    done = _job(tmp_path, "train.py", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    for name in SHIPPED:
        assert f"jobs/configs/{name}" in text
    assert "python jobs/train.py --config jobs/configs/demo.yaml\n" in text  # the demo
    own = text[text.index("--config jobs/configs/your-corpus.yaml") :]  # your corpus, a real model
    own = own[: own.index("\n\n")]
    assert "--set data.path=" in own and "--set model.name_or_path=" in own
    assert "--set run.name=" in text[text.index("resumes") :]  # another run / resuming one
    assert "train.epochs=3" in text  # the --set example of this job
    assert list(tmp_path.iterdir()) == []


def test_mine_help_gives_a_mining_set_example(tmp_path):
    done = _job(tmp_path, "mine.py", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train.epochs" not in done.stdout
    assert "--set mining.num_negatives=3" in " ".join(done.stdout.split())  # argparse wraps it
    assert "Output columns: anchor, positive, negative_1" in done.stdout  # the whole docstring


def test_evaluate_help_shows_examples_and_formats(tmp_path):
    done = _job(tmp_path, "evaluate.py", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python jobs/evaluate.py --model" in done.stdout
    assert "told apart by name and first line" in done.stdout  # the STS formats, with no flag to set
    assert "train.epochs" not in done.stdout


@pytest.mark.parametrize(
    ("argv", "called"),
    [([], False), (["--debug"], False), (["--set", "train.epochs=2"], True)],
    ids=["nothing", "debug-only", "set-only"],
)
def test_needs_config_stops_only_without_config_and_set(argv, called, capsys):
    seen = []
    code = job_main("Doc.", argv, lambda cfg, echo, args: seen.append(cfg), needs_config=True)
    assert code == (0 if called else EXIT_CONFIG)
    assert bool(seen) == called
    if called:
        assert seen[0].train.epochs == 2  # --set alone runs on the defaults plus the override
    else:
        assert "no config given" in capsys.readouterr().err


def test_job_main_without_needs_config_runs_on_defaults():
    seen = []
    assert job_main("Doc.", [], lambda cfg, echo, args: seen.append(cfg)) == 0
    assert seen and seen[0].data.path is None


@pytest.mark.parametrize(
    ("header", "summary"),
    [
        ("# One sentence.\n# More.\n", "One sentence"),
        ("# Only line, with a comma\n", "Only line, with a comma"),
        ("# Head: a, b (c, d), e\n# goes on\n", "Head: a, b (c, d)"),
        ("# Head: a (b, c, d\n# e) goes on\n", "Head: a"),
        ("# A list:\n# - item\n", "A list"),
        ("key: 1\n", ""),
    ],
)
def test_config_summary_ends_at_a_whole_clause(tmp_path, header, summary):
    path = tmp_path / "c.yaml"
    path.write_text(header + "run:\n  name: x\n")
    assert config_summary(path) == summary


def _console(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The installed ``raysimcse`` console script (``pip install -e .`` puts it beside python)."""
    script = str(Path(PYTHON).parent / "raysimcse")
    return subprocess.run(
        [script, *args], cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=120
    )


def test_the_console_script_names_its_version_and_jobs(tmp_path):
    from importlib.metadata import version

    done = _console(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"raysimcse {version('raysimcse')}"
    done = _console(tmp_path)
    assert done.returncode == 2 and all(f"  {job} " in done.stdout for job in ("train", "mine", "evaluate"))
    done = _console(tmp_path, "fit")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: unknown job 'fit'; one of: train, mine, evaluate"


@pytest.mark.parametrize("job", ["train", "mine", "evaluate"])
def test_each_console_job_takes_the_flags_of_its_script(tmp_path, job):
    console, script = _console(tmp_path, job, "--help"), _job(tmp_path, f"{job}.py", "--help")
    assert console.returncode == script.returncode == 0, console.stderr[-2000:]
    assert console.stdout.startswith(f"usage: raysimcse {job} ")

    # The same help but for the program's name (argparse wraps usage lines by its length).
    def body(text: str) -> str:
        return " ".join(text.split("\n\n", 1)[1].split())

    assert body(console.stdout) == body(script.stdout)


def test_a_console_job_runs_as_its_script_does(tmp_path):
    done = _console(
        tmp_path, "train", "--config", str(REPO / "jobs/configs/demo.yaml"), "--set", "train.epochs=0"
    )
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "error: train.epochs must be >= 1 (got 0)"
