"""The layering (pyproject's [tool.importlinter]) holds: drivers on top, stages below, no stage
reaching up. `make lint` runs the same check; here it is part of `make test`, and so of CI."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, REPO


def test_import_layers_hold():
    lint_imports = Path(PYTHON).parent / "lint-imports"
    proc = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_a_stage_reaching_up_is_caught(tmp_path):
    """The check can fail: a copy of the package where config imports a driver breaks it."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(REPO / "pipeline", copy / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    (copy / "pipeline/config/reaching_up.py").write_text(
        "from pipeline.jobs import train_job  # noqa: F401\n"
    )
    lint_imports = Path(PYTHON).parent / "lint-imports"
    env = {"PYTHONPATH": str(copy), "PATH": str(Path(PYTHON).parent)}
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=copy, capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "pipeline.config.reaching_up -> pipeline.jobs.train_job" in proc.stdout
