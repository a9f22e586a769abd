"""The training driver's peak memory on a large pair file: how much of the data passes through
the driver process on its way to the workers (issue 37: a 10-million-row file must not become
10 million Python strings on the driver).

Generates a headerless ``pairs_tsv`` file of ``--rows`` (anchor, positive) pairs of distinct
texts, then runs the training job's driver stages on it in a fresh process, inside a local Ray:
read and index the pairs (``load_training_data``), tokenize them on Ray Data
(``tokenize_inputs``) and put the inputs in the object store (``put_inputs``), exactly as
``jobs/train.py`` does before it starts the trainer. It prints a table of the driver's resident
memory before the data stages (after Ray started) and its peak (``VmHWM``) after them, then each
stage's own peak (``VmHWM`` reset before it) and the memory it left resident.

    python -m bench.driver_memory --rows 2000000 --model runs/recipe-data/all-MiniLM-L6-v2

``--stage-only`` runs the measured process itself (what the bench starts), and accepts the
old ``mining.negative_mode=triplet`` config of commits before ``task: pairs`` through ``--set``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def write_pairs(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` lines ``anchor<TAB>positive``: word sequences over a 20,000-word vocabulary,
    6 to 14 words, every text distinct (a row number is woven in)."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i:05d}" for i in range(20_000)])
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            lengths = rng.integers(6, 15, size=(n, 2))
            words = vocabulary[rng.integers(0, len(vocabulary), size=(n, 2, 14))]
            lines = []
            for i in range(n):
                anchor = " ".join(words[i, 0, : lengths[i, 0]])
                positive = " ".join(words[i, 1, : lengths[i, 1]])
                lines.append(f"row {start + i} {anchor}\tabout {start + i} {positive}\n")
            out.writelines(lines)


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Start a new ``VmHWM`` from the current resident size (Linux: ``clear_refs`` 5), so that
    each stage's peak is its own."""
    Path("/proc/self/clear_refs").write_text("5")


def run_stages(path: str, model: str, sets: list[str], workdir: Path) -> dict[str, Any]:
    """The driver's data stages on ``path``: the driver's memory before them, its peak over
    all of them, and each stage's own peak and what it left resident."""
    from pipeline.config.loading import load_config
    from pipeline.core.errors import ConfigError
    from pipeline.jobs.train_inputs import load_training_data, put_inputs, tokenize_inputs
    from pipeline.runtime.cluster import ray_session
    from pipeline.tracking.run import start_or_resume_run

    base = [f"data.path={path}", "data.format=pairs_tsv", f"model.name_or_path={model}", "model.pooler=mean",
            "eval.sts=[]", "eval.retrieval=[]", f"run.output_dir={workdir}", "run.name=driver-memory",
            "ray.num_cpus=4", "tracking.system_metrics=false"]  # fmt: skip
    try:
        cfg = load_config(None, ["task=pairs", *base, *sets])
    except ConfigError:  # a commit before `task: pairs`
        cfg = load_config(None, ["mining.negative_mode=triplet", *base, *sets])
    tracked = start_or_resume_run(f"sqlite:///{workdir / 'mlruns.db'}", "driver-memory", "driver-memory")
    stages: list[dict[str, Any]] = []

    def measured(name: str, stage: Callable[[], Any]) -> Any:
        _reset_peak()
        started = time.perf_counter()
        result = stage()
        stages.append({"stage": name, "peak_mib": _rss_mib("VmHWM"), "after_mib": _rss_mib("VmRSS"),
                       "seconds": time.perf_counter() - started})  # fmt: skip
        return result

    with ray_session(cfg):
        before = _rss_mib("VmRSS")
        started = time.perf_counter()
        data = measured("read and index the pairs", lambda: load_training_data(cfg, tracked, print))
        inputs = measured("tokenize", lambda: tokenize_inputs(cfg, data, workdir / "run", tracked, print))
        measured(
            "put in the object store",
            lambda: put_inputs(cfg, data, inputs, sts_files=[], echo=print, retrieval_sets=[]),
        )
        seconds = time.perf_counter() - started
    tracked.finish()
    return {"rows": data.rows, "texts": len(data.texts) if hasattr(data, "texts") else inputs.corpus.num_rows, "rss_before_mib": before,
            "peak_rss_mib": max(s["peak_mib"] for s in stages), "seconds": seconds, "stages": stages}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument(
        "--model", default="runs/recipe-data/all-MiniLM-L6-v2", help="a model folder (its tokenizer)"
    )
    parser.add_argument("--input", default=None, help="an existing pairs_tsv file instead of a generated one")
    parser.add_argument("--set", action="append", default=[], dest="sets", help="extra config overrides")
    parser.add_argument("--label", default="", help="a name for this side (before / after)")
    parser.add_argument("--stage-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(prefix="driver-memory-") as tmp:
        workdir = Path(tmp)
        if args.stage_only:
            print("RESULT " + json.dumps(run_stages(args.input, args.model, args.sets, workdir)), flush=True)
            return 0
        path = Path(args.input) if args.input else workdir / "pairs.tsv"
        if not args.input:
            write_pairs(path, args.rows)
        size = path.stat().st_size / 2**20
        # The script's own path, so that another checkout's venv measures its own code (the
        # "before" side: python /path/to/this/bench/driver_memory.py from the old checkout).
        command = [sys.executable, str(Path(__file__).resolve()), "--stage-only", "--input", str(path),
                   "--model", str(Path(args.model).resolve()), *[f"--set={s}" for s in args.sets]]  # fmt: skip
        env = {**os.environ, "RAY_TMPDIR": str(workdir)}
        proc = subprocess.run(command, cwd=os.getcwd(), env=env, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            return 1
        result = json.loads(lines[-1][len("RESULT ") :])
    print(
        "| side | pair rows | distinct texts | file MiB | driver RSS before MiB | driver peak RSS MiB | data stages s |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.label or 'this checkout'} | {result['rows']:,} | {result['texts']:,} | {size:.0f} | "
          f"{result['rss_before_mib']:.0f} | {result['peak_rss_mib']:.0f} | {result['seconds']:.0f} |")  # fmt: skip
    if result.get("stages"):  # older checkouts' --stage-only reports no stages
        print("\n| stage | peak RSS MiB | RSS after MiB | s |\n|---|---|---|---|")
        for stage in result["stages"]:
            print(
                f"| {stage['stage']} | {stage['peak_mib']:.0f} | {stage['after_mib']:.0f} | {stage['seconds']:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
