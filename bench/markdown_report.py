"""What every ``bench/`` script records with its table: the machine, and the section appended
to ``docs/benchmarks.md``. Standard library only, so that ``bench/gpu_step.py`` still runs on
a machine with nothing but torch, numpy and transformers."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

GIB = 2**30
BENCHMARKS_DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is appended by a script in `bench/`; rerun it to reproduce.\n"


def machine_info(packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """Platform, CPU count, RAM (GiB, None where unknown), Python and ``packages``' versions."""
    info: dict[str, Any] = {"platform": f"{platform.system()} {platform.machine()}", "cpus": os.cpu_count()}
    try:
        info["ram_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB)
    except (ValueError, OSError, AttributeError):
        info["ram_gib"] = None
    info["python"] = platform.python_version()
    info["packages"] = list(packages)
    for name in packages:
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = "not installed"
    return info


def machine_line(info: dict[str, Any]) -> str:
    """``Linux x86_64, 2 CPUs, 24 GiB RAM``."""
    return f"{info['platform']}, {info['cpus']} CPUs, {info['ram_gib']} GiB RAM"


def machine_and_versions(info: dict[str, Any]) -> str:
    """``Linux x86_64, 2 CPUs, 24 GiB RAM; Python 3.11.7, torch 2.13.0, ...``: the machine,
    then Python and each package :func:`machine_info` was asked for, in that order."""
    versions = "".join(f", {name} {info[name]}" for name in info["packages"])
    return f"{machine_line(info)}; Python {info['python']}{versions}"


def append_section(section: str, path: Path = BENCHMARKS_DOC) -> None:
    """Append a markdown section (starting with its ``###`` heading) to ``path``, creating the
    file with the document's heading first if it does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER)
    with path.open("a") as fh:
        fh.write(section)
