"""Build the Python packages the GPU machine lacks into one xz tarball that travels with a run.

The lent GPU machine (one H100 or H200, Python 3.12, no network) has torch, transformers,
sentence-transformers, numpy, pyarrow and most of what they need, but not Ray, MLflow or
FAISS, and a command may take at most 64 MiB along (the working tree included). Ray's wheel
alone is 79 MB. This script:

1. resolves the job's dependencies (``pyproject.toml``'s, with the ``cpu`` extra's FAISS) for
   CPython 3.12 on manylinux x86-64, with pip's resolver in dry-run mode;
2. drops every package the GPU machine already has (``bench/gpu_machine_packages.txt``);
3. installs the rest, unpacked, into a staging folder, deletes what a Train/Data job never
   imports or serves (``ray/jars``, ``ray/rllib``, ``ray/serve``, ``ray/llm``, MLflow's web
   UI), byte-code caches and console scripts (their shebangs name this machine's interpreter);
4. packs the folder with ``tar | xz -9e`` (6 MiB smaller than ``-6``, a minute slower) into
   ``.gpu-bundle/gpu-site.tar.xz`` (git-ignored), prints its size, the working tree's size
   and their sum against the 64 MiB limit (exit 1 when over), and the one line that unpacks
   it on the GPU machine.

``--check`` then tests the bundle the way the GPU machine will use it: a clean Python 3.12
venv gets the machine's own packages (the pinned versions in the list, newest otherwise;
torch is the CUDA build, as there), the bundle is unpacked beside it on ``PYTHONPATH``, and
``import ray.train.torch, ray.data, mlflow, faiss`` must succeed, then the demo job
(``jobs/train.py --config jobs/configs/demo.yaml``) must train and mine on the CPU.

Usage (from the repository root; needs pip's access to the package registry):

    python -m bench.gpu_bundle                 # build, print sizes and the unpack line
    python -m bench.gpu_bundle --check         # build if missing, then the venv check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

from bench.common import REPO, argument_parser

PRESENT_LIST = REPO / "bench" / "gpu_machine_packages.txt"
BUNDLE_DIR = REPO / ".gpu-bundle"
BUNDLE_NAME = "gpu-site.tar.xz"
# What one device call may take along: the working tree plus carried paths.
CARRY_LIMIT_BYTES = 64 * 1024 * 1024
# Never imported or served by a Ray Train / Ray Data job logging to a local sqlite store:
# Ray's Java jars, RLlib, Serve and LLM (45 MB unpacked) and MLflow's web UI (28 MB). Ray's
# dashboard UI stays: the dashboard (which Ray Train's state polling needs) will not start
# without it.
UNUSED = ("ray/jars", "ray/rllib", "ray/serve", "ray/llm", "mlflow/server/js")
# Where the GPU machine unpacks the bundle: outside the working tree, so it survives between
# commands while the machine stays up and is never sent back.
DEVICE_SITE = "/tmp/gpu-site"
PYTHON_VERSION = "3.12"
# pip matches manylinux tags exactly; the GPU machine's glibc (Ubuntu 24.04) is 2.39.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name (``Foo_Bar`` and ``foo-bar`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_present(path: Path = PRESENT_LIST) -> dict[str, str | None]:
    """The GPU machine's packages: canonical name -> version seen there (or None)."""
    present: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        present[canonical_name(name)] = version or None
    return present


def job_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The job's runtime requirements: the project's dependencies plus the ``cpu`` extra
    (faiss-cpu; the GPU machine is CUDA 13, for which there is no faiss-gpu wheel, so GPU
    nearest-neighbour search there is the torch path), and the ``dev`` extra's ``datasets``:
    the machine has sentence-transformers but not ``datasets``, which its trainer and
    ``mine_hard_negatives`` read their rows from (``gpu_session.sh peers``)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    peers = [req for req in extras["dev"] if req.startswith("datasets")]
    return list(project["dependencies"]) + list(extras["cpu"]) + peers


def missing_packages(resolved: dict[str, str], present: dict[str, str | None]) -> dict[str, str]:
    """The resolved packages (canonical name -> version) the GPU machine does not have."""
    wanted = {canonical_name(name): version for name, version in resolved.items()}
    return {name: version for name, version in sorted(wanted.items()) if name not in present}


def pip(python: str, *args: str) -> None:
    """pip under ``python``. Resolving for 3.12 needs a 3.12 interpreter: pip 23 checks a
    package's Requires-Python against the running one even with ``--python-version``."""
    subprocess.run([python, "-m", "pip", *args], check=True)


def target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def resolve(
    python: str, requirements: list[str], workdir: Path, present: dict[str, str | None]
) -> dict[str, str]:
    """Every package (canonical name -> version) pip would install for ``requirements`` on
    CPython 3.12 manylinux x86-64, found by a dry run; nothing is installed. The versions the
    GPU machine is known to have are constraints, so the resolution is the one it will see
    (a newer torch would pull CUDA packages that machine lacks)."""
    report = workdir / "resolve.json"
    constraints = workdir / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in present.items() if v))
    pip(
        python,
        "install",
        "--quiet",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "--constraint",
        str(constraints),
        "--target",
        str(workdir / "unused"),
        *target_args(),
        *requirements,
    )
    installs = json.loads(report.read_text())["install"]
    return {canonical_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def trim(site: Path) -> int:
    """Delete what the job never imports or runs; returns the bytes removed."""
    doomed = [site / part for part in UNUSED] + [site / "bin"]
    doomed += list(site.rglob("__pycache__"))
    removed = 0
    for path in doomed:
        if path.is_dir():
            removed += tree_bytes(path)
            shutil.rmtree(path)
    return removed


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def working_tree_bytes(root: Path = REPO) -> int:
    """Bytes of what a device call sends besides carried paths: tracked files and untracked
    files git does not ignore."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    files = [root / name for name in listing.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def unpack_line(bundle: Path = BUNDLE_DIR / BUNDLE_NAME) -> str:
    """The shell line that unpacks the bundle on the GPU machine once and puts it on the path."""
    rel = bundle.relative_to(REPO)
    return (
        f"[ -d {DEVICE_SITE}/ray ] || {{ mkdir -p {DEVICE_SITE} && tar -xJf {rel} -C {DEVICE_SITE}; }}"
        f" && export PYTHONPATH={DEVICE_SITE}:$PWD"
    )


def build(bundle_dir: Path, python: str) -> Path:
    bundle_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        work = Path(tmp)
        present = read_present()
        missing = missing_packages(resolve(python, job_requirements(), work, present), present)
        (bundle_dir / "packages.txt").write_text("".join(f"{n}=={v}\n" for n, v in missing.items()))
        print(f"{len(missing)} packages the GPU machine lacks:")
        print("  " + " ".join(f"{n}=={v}" for n, v in missing.items()), flush=True)
        site = work / "site"
        pip(
            python,
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--root-user-action=ignore",
            "--target",
            str(site),
            *target_args(),
            *(f"{n}=={v}" for n, v in missing.items()),
        )
        unpacked = tree_bytes(site)
        removed = trim(site)
        bundle = bundle_dir / BUNDLE_NAME
        print(
            f"packing {(unpacked - removed) / 2**20:.0f} MiB ({removed / 2**20:.0f} MiB trimmed) ...",
            flush=True,
        )
        with bundle.open("wb") as out:
            tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-9e", "-T0"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait() != 0:
                raise SystemExit("gpu_bundle: tar failed")
    return bundle


def report_size(bundle: Path) -> bool:
    """Prints the sizes against the limit; True when everything fits."""
    bundle_bytes = bundle.stat().st_size
    tree = working_tree_bytes()
    total = bundle_bytes + tree
    fits = total <= CARRY_LIMIT_BYTES
    print(f"bundle        {bundle_bytes / 2**20:6.1f} MiB  {bundle.relative_to(REPO)}")
    print(f"working tree  {tree / 2**20:6.1f} MiB  (tracked and untracked, not ignored)")
    print(
        f"together      {total / 2**20:6.1f} MiB  of {CARRY_LIMIT_BYTES / 2**20:.0f} MiB: "
        + ("fits" if fits else "OVER THE LIMIT")
    )
    print(f"carry: [{str(bundle.parent.relative_to(REPO))!r}]; on the GPU machine, first:")
    print(f"  {unpack_line(bundle)}")
    return fits


def check(bundle: Path, python312: str) -> None:
    """A clean 3.12 venv standing in for the GPU machine, the bundle on PYTHONPATH, the
    imports and the demo job."""
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-check-") as tmp:
        work = Path(tmp)
        venv = work / "venv"
        subprocess.run([python312, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        present = read_present()
        resolved = resolve(python312, job_requirements(), work, present)
        stand_in = [
            f"{name}=={present[name] or version}" for name, version in resolved.items() if name in present
        ]
        print(f"stand-in for the GPU machine: {len(stand_in)} of its packages ...", flush=True)
        pip(python, "install", "--quiet", "--root-user-action=ignore", *stand_in)
        site = work / "site"
        site.mkdir()
        subprocess.run(["tar", "-xJf", str(bundle), "-C", str(site)], check=True)
        env = dict(os.environ, PYTHONPATH=f"{site}:{REPO}", RAY_AUTH_MODE="disabled")
        env.pop("VIRTUAL_ENV", None)
        probe = (
            "import sys, ray.train.torch, ray.data, mlflow, faiss, torch;"
            "print('imports ok: python', sys.version.split()[0], 'ray', ray.__version__,"
            " 'mlflow', mlflow.__version__, 'faiss', faiss.__version__, 'torch', torch.__version__)"
        )
        subprocess.run([python, "-c", probe], env=env, check=True)
        runs = work / "runs"
        demo = [
            python,
            "jobs/train.py",
            "--config",
            "jobs/configs/demo.yaml",
            "--set",
            f"run.output_dir={runs}",
            "--set",
            f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
        ]
        print("demo job in the stand-in venv ...", flush=True)
        subprocess.run(demo, env=env, cwd=REPO, check=True)
        print("check passed: the bundle imports and runs the demo job on Python 3.12")


def python312() -> str:
    """``$PYTHON312``, else the first Python 3.12 that runs: ``python3.12`` on the PATH, then
    pyenv's (whose ``python3.12`` shim fails where 3.12 is installed but not selected)."""
    if "PYTHON312" in os.environ:
        return os.environ["PYTHON312"]
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"), reverse=True)
    for candidate in ["python3.12", *map(str, pyenv)]:
        try:
            subprocess.run([candidate, "-m", "pip", "--version"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    return "python3.12"  # the error names it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    parser.add_argument("--check", action="store_true", help="test the bundle in a clean Python 3.12 venv")
    parser.add_argument("--rebuild", action="store_true", help="build even when a bundle exists")
    parser.add_argument(
        "--python312",
        default=None,
        help="a Python 3.12 interpreter with pip (default: $PYTHON312, python3.12, or pyenv's 3.12)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.python312 = args.python312 or python312()
    bundle = BUNDLE_DIR / BUNDLE_NAME
    if args.rebuild or not bundle.exists():
        bundle = build(BUNDLE_DIR, args.python312)
    fits = report_size(bundle)
    if args.check:
        check(bundle, args.python312)
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
