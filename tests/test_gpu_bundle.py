"""bench.gpu_bundle's pure parts: which packages travel, what it trims, the size it counts.
(Building it needs the package registry and minutes: `python -m bench.gpu_bundle --check`.)"""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

import bench.gpu_bundle


@pytest.fixture(scope="module")
def bundle():
    return bench.gpu_bundle


def test_the_machines_list_names_what_the_job_finds_there(bundle):
    present = bundle.read_present()
    assert present["torch"] == "2.11.0" and present["sentence-transformers"] == "6.0.1"
    assert {"numpy", "pyarrow", "transformers", "pyyaml", "grpcio", "aiohttp", "psutil"} <= set(present)
    # What the job needs and that machine lacks must not be on the list, or nothing carries it.
    assert not {"ray", "mlflow", "faiss-cpu", "tenacity", "jsonschema", "pydantic"} & set(present)


def test_requirements_are_the_projects_own_with_cpu_faiss(bundle):
    requirements = bundle.job_requirements()
    assert any(r.startswith("ray[") for r in requirements)
    assert any(r.startswith("faiss-cpu") for r in requirements)
    assert not any(r.startswith("faiss-gpu") for r in requirements)  # no CUDA 13 build exists


def test_only_packages_the_machine_lacks_travel(bundle):
    resolved = {"ray": "2.60.0", "numpy": "2.5.2", "torch": "2.11.0", "mlflow-skinny": "3.17.2"}
    present = bundle.read_present()
    assert bundle.missing_packages(resolved, present) == {"mlflow-skinny": "3.17.2", "ray": "2.60.0"}
    # Names compare normalised, as pip does: Foo_Bar, foo.bar and foo-bar are one project.
    assert (
        bundle.canonical_name("Typing_Extensions")
        == "typing-extensions"
        == bundle.canonical_name("typing.extensions")
    )
    assert bundle.missing_packages({"PyYAML": "6.0"}, {bundle.canonical_name("pyyaml"): None}) == {}


def test_trim_removes_what_the_job_never_imports_and_keeps_the_rest(bundle, tmp_path):
    for part in (
        "ray/jars/a.jar",
        "ray/rllib/x.py",
        "ray/serve/x.py",
        "ray/llm/x.py",
        "mlflow/server/js/build/i.js",
    ):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_bytes(b"x" * 100)
    kept = [
        "ray/train/torch/__init__.py",
        "ray/dashboard/client/build/index.html",
        "mlflow/server/__init__.py",
    ]
    for part in kept + ["bin/ray", "ray/__pycache__/a.pyc"]:
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / part).write_bytes(b"y" * 10)
    removed = bundle.trim(tmp_path)
    assert removed == 5 * 100 + 2 * 10
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)


def test_working_tree_size_is_what_a_device_call_sends(bundle):
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    expected = sum((REPO / f).stat().st_size for f in listed if f and (REPO / f).is_file())
    assert bundle.working_tree_bytes() == expected
    assert expected < bundle.CARRY_LIMIT_BYTES // 8  # the bundle needs the rest


def test_unpack_line_unpacks_once_outside_the_tree(bundle):
    line = bundle.unpack_line()
    assert line.startswith(f"[ -d {bundle.DEVICE_SITE}/ray ] ||")
    assert "tar -xJf .gpu-bundle/gpu-site.tar.xz" in line and line.endswith(
        f"PYTHONPATH={bundle.DEVICE_SITE}:$PWD"
    )
