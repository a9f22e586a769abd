"""The bench package: every script imports as a module of it, appends its run under its own
heading of docs/benchmarks.md, and names the command it was run with; gpu_step runs end to end
on a tiny model."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest
from conftest import REPO

import bench
from bench.common import BENCHMARKS_DOC, HEADER, Benchmark, append_run, command_line, run_section

SCRIPTS = sorted(
    info.name
    for info in pkgutil.iter_modules(bench.__path__)
    if info.name not in ("common", "running_job", "local_cluster", "embedded_texts")
)


def test_every_script_imports_as_a_module_of_the_package():
    for name in SCRIPTS:
        module = importlib.import_module(f"bench.{name}")
        assert module.__doc__, f"bench.{name} has no docstring"
        assert f"python -m bench.{name}" in module.__doc__, name


def test_each_appending_script_has_its_heading_in_the_benchmarks_doc():
    headings = {line[3:] for line in BENCHMARKS_DOC.read_text().splitlines() if line.startswith("## ")}
    modules = {name: importlib.import_module(f"bench.{name}") for name in SCRIPTS}
    benchmarks = {name: m.BENCHMARK for name, m in modules.items() if hasattr(m, "BENCHMARK")}
    assert len(benchmarks) == 15 and {b.heading for b in benchmarks.values()} <= headings
    assert all(b.module == f"bench.{name}" for name, b in benchmarks.items())  # the command it reports
    # One section per benchmark: no heading twice at any level.
    all_headings = [line for line in BENCHMARKS_DOC.read_text().splitlines() if line.startswith("#")]
    assert len(all_headings) == len(set(all_headings))


def test_a_run_lands_at_the_end_of_its_benchmarks_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## A\n\nabout A\n\n### a1\n\nold\n\n## B\n\nabout B\n")
    append_run("A", "\n### a2\n\nnew\n", doc)
    append_run("B", "\n### b1\n\nfirst\n", doc)
    append_run("C", "\n### c1\n\nthird\n", doc)
    assert doc.read_text() == (
        "# Benchmarks\n\n## A\n\nabout A\n\n### a1\n\nold\n\n### a2\n\nnew\n\n"
        "## B\n\nabout B\n\n### b1\n\nfirst\n\n## C\n\n### c1\n\nthird\n"
    )
    fresh = tmp_path / "out" / "benchmarks.md"  # as on the GPU machine: $OUT/benchmarks.md
    append_run("A", run_section("tiny", "Linux", "python -m bench.x", "body"), fresh)
    text = fresh.read_text()
    assert text.startswith(HEADER) and "\n## A\n\n### tiny (" in text
    assert text.endswith("Machine: Linux. Command: `python -m bench.x`. body\n")


def test_the_command_is_the_module_with_its_arguments_quoted():
    assert command_line("bench.gpu_step", ["--size", "tiny", "--set", "a=b c"]) == (
        "python -m bench.gpu_step --size tiny --set 'a=b c'"
    )


def test_a_side_by_side_parser_resolves_the_model_and_refuses_counts_below_one(tmp_path, capsys):
    benchmark = Benchmark("bench.x", "X")
    parser = benchmark.parser("X.\n\nmore", side_by_side=True)
    parser.add_argument("--repeats", type=int, default=2)
    args = benchmark.parse(parser, ["--model", str(tmp_path), "--append", "out.md"])
    assert args.model == tmp_path and args.max_seq_len == 32 and str(args.append) == "out.md"
    assert parser.prog == "python -m bench.x" and parser.description == "X."
    with pytest.raises(SystemExit):
        benchmark.parse(parser, ["--model", str(tmp_path), "--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_step_runs_on_a_tiny_model_on_the_cpu(tmp_path):
    """The per-worker benchmark through the pipeline's own step, optimizer step, encoding and
    search, run as its docs say (from the repository root, as a module)."""
    out = tmp_path / "gpu_step.json"
    subprocess.run(
        [sys.executable, "-m", "bench.gpu_step", "--size", "tiny", "--device", "cpu", "--steps", "2",
         "--warmup", "1", "--phases", "1", "--encode-rows", "64", "--knn-rows", "500",
         "--knn-queries", "50", "--dim", "32", "--json", str(out)],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m bench.gpu_step --size tiny")
    train, knn = report["results"]["train"], report["results"]["knn"]
    assert train["loss_last"] < 10 and set(train["phase_ms"]) >= {"backward", "clip grad norm"}
    assert knn["self_found_first"] == 1.0


@pytest.mark.parametrize(
    ("cmdline", "name"),
    [
        ("ray::RayTrainWorker.__init__", "ray::RayTrainWorker.__init__"),
        ("ray::IDLE", "ray::IDLE"),
        ("/venv/bin/python -u /venv/lib/ray/dashboard/dashboard.py --host=127.0.0.1", "dashboard.py"),
        ("/venv/bin/python3.11 -m bench.train_throughput --child ours", "-m bench.train_throughput"),
        ("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/x", "raylet"),
        ("", "?"),
    ],
)
def test_a_process_is_named_by_its_ray_title_script_or_executable(cmdline, name):
    from bench.common import process_name

    assert process_name(cmdline) == name


def test_the_machine_report_names_faiss_by_its_module_whichever_wheel_installed_it():
    """faiss' wheels are ``faiss-cpu`` and ``faiss-gpu-cu12``; the module's version is the one
    a table records, and a package that is nowhere is said to be so."""
    import faiss

    from bench.common import machine_info

    info = machine_info(("faiss", "no-such-package-here"))
    assert info["faiss"] == faiss.__version__
    assert info["no-such-package-here"] == "not installed"


def _fake_ray_start(tmp_path, outcomes: list[str]) -> list[str]:
    """A stand-in for Ray's command line whose n-th start prints ``outcomes[n]``: Ray's line for
    a raylet that did not register in time (and exits), or for one that joined (and stays until
    stopped)."""
    script = tmp_path / "fake_ray.py"
    script.write_text(
        "import pathlib, signal, sys\n"
        f"count = pathlib.Path({str(tmp_path / 'starts')!r})\n"
        "n = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(n + 1))\n"
        f"outcome = {outcomes!r}[min(n, {len(outcomes) - 1})]\n"
        "print(outcome, flush=True)\n"
        "if outcome.startswith('Exception'):\n"
        "    sys.exit(1)\n"
        "signal.pause()  # stays, as ray start --block does, until the node is stopped\n"
    )
    return [sys.executable, str(script)]


def test_a_worker_node_whose_raylet_registered_late_is_started_again(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import bench.local_cluster as lc

    timed_out = "Exception: The current node timed out during startup. This could happen ..."
    monkeypatch.setattr(lc, "RAY_CLI", _fake_ray_start(tmp_path, [timed_out, "Ray runtime started."]))
    head = SimpleNamespace(address="127.0.0.1:1", log=tmp_path / "head.log", env=dict(os.environ))
    node = lc.RayWorkerNode(head, "b", num_cpus=1, timeout=60)
    try:
        assert (tmp_path / "starts").read_text() == "2"
        assert timed_out in node.log.read_text() and "Ray runtime started" in node.log.read_text()
    finally:
        node.stop()
    # A start that keeps timing out ends after NODE_STARTS tries, with Ray's own line.
    (tmp_path / "starts").unlink()
    monkeypatch.setattr(lc, "RAY_CLI", _fake_ray_start(tmp_path, [timed_out]))
    with pytest.raises(RuntimeError, match="(?s)worker node c did not join.*timed out during startup"):
        lc.RayWorkerNode(head, "c", num_cpus=1, timeout=60)
    assert (tmp_path / "starts").read_text() == str(lc.NODE_STARTS)
    # Any other exit is not started again.
    (tmp_path / "starts").unlink()
    monkeypatch.setattr(lc, "RAY_CLI", _fake_ray_start(tmp_path, ["Exception: could not connect"]))
    with pytest.raises(RuntimeError, match="worker node d did not join"):
        lc.RayWorkerNode(head, "d", num_cpus=1, timeout=60)
    assert (tmp_path / "starts").read_text() == "1"
