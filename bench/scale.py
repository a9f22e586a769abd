"""Memory against corpus size and train workers (issue 58): each train worker holds its share of
the corpus, so its data memory falls with the number of workers.

    python -m bench.scale --rows 1000000,4000000 --workers 1,2,4

For each corpus size (and a 10,000-row corpus, the baseline) and each worker count W, one
``jobs/train.py`` run of the corpus task with the tiny model on a local multi-node Ray cluster
(:mod:`bench.local_cluster`): the driver on the head, which also tokenizes and keeps the
corpus' blocks, and the W train workers on a second node labelled ``role=trainer``, so every
row a worker holds crossed from the head's object store. No mining (``mining.refresh=never``):
the miner still holds the whole corpus (issue 59); this measures the driver and the workers.

The corpus is generated (:func:`pipeline.data.synthetic.write_generated_corpus`; beyond 1M
rows, copies of the 1M corpus, each copy's lines led by a word of their own), and the tiny
model's tokenizer is trained once on its first 20,000 lines and passed as ``model.name_or_path``
(a run without one trains its tokenizer on every text, on the driver). Each run goes until rank 0
is held at step 20 (a seam: the share was fetched and 19 steps trained), then the bench reads
every process's peak RSS (``VmHWM``) and ends the run (it stops only the processes
it started). The object store's peak is the largest total of Ray's ``object_store_bytes_used``
over the cluster, polled every second.

A worker's data memory is its peak RSS minus the same W's peak on the 10,000-row corpus (the
interpreter, torch, the model and Ray's own); its ratio is against W = 1 at the same size
(issue 58's goals: at most 0.55 at W = 2 and 0.3 at W = 4). The driver's bytes a row are its
peak above the baseline run's, over the rows. Peak RSS counts every object-store page a
process has read (Ray maps the store into each process, and a page once touched stays in its
RSS), so each figure is also given for ``RssAnon``, the process's own heap, sampled every 0.2 s.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import Benchmark, Sampler, machine_report, status_bytes
from bench.local_cluster import RayHead, RayWorkerNode
from bench.running_job import JobWaitError, RunningJob, titled

BENCHMARK = Benchmark("bench.scale", "Memory against corpus size and train workers")
BASELINE_ROWS = 10_000
GENERATED_ROWS = 1_000_000
"""The largest corpus the generator makes here; larger ones are its copies (:func:`prepare`)."""
TRAINER_CPUS = 4
"""Logical CPUs of the trainer node: W up to 4 workers of 1 CPU (the 2 cores are shared)."""
JOB_TIMEOUT_S = 3600.0
HOLD_STEP = 20
"""Rank 0 is held at this step (:func:`pipeline.core.seams.hold_once`) while the peaks are read:
after the epoch's share was fetched and some steps trained, at the same point in every run."""
MIB = 2**20
CONFIG = """\
task: corpus
data: {max_seq_len: 32, tokenize_num_cpus: 0.25}
model: {pooler: mean}
train: {epochs: 1, batch_size: 64, cpus_per_worker: 1, label_selector: {role: trainer}}
mining: {refresh: never}
tracking: {experiment: scale, system_metrics: false}
"""


def vm_hwm(process: psutil.Process) -> int:
    """The process's peak resident set (bytes) since it started, by the kernel's count. It
    counts every object-store page the process ever read (Ray maps the store into each
    process), so :class:`AnonPeaks` gives the process's own memory too."""
    return status_bytes(process.pid, "VmHWM")


class AnonPeaks(Sampler):
    """Each process's largest ``RssAnon`` (its own heap: resident memory that is not a mapped
    file or the shared object store), sampled every 0.2 s; processes are found again every
    second (``find``). The kernel keeps no peak of it, so this is a sampled one."""

    def __init__(self, find: Any):
        super().__init__(0.2)
        self.find, self.peaks = find, {}
        self.pids: list[int] = []
        self.ticks = 0

    def sample(self) -> None:
        if self.ticks % 5 == 0:
            self.pids = self.find()
        self.ticks += 1
        for pid in self.pids:
            self.peaks[pid] = max(self.peaks.get(pid, 0), status_bytes(pid, "RssAnon"))


class ObjectStorePeak(Sampler):
    """The largest ``object_store_bytes_used`` summed over the cluster's nodes, polled every second."""

    def __init__(self, address: str):
        from ray._private.internal_api import get_state_from_address

        super().__init__(1.0)
        self.state, self.peak = get_state_from_address(address), 0

    def sample(self) -> None:
        from ray._private.internal_api import get_memory_info_reply

        with contextlib.suppress(Exception):  # a node that is starting answers nothing yet
            used = get_memory_info_reply(self.state).store_stats.object_store_bytes_used
            self.peak = max(self.peak, int(used))


def prepare(workdir: Path, rows: int) -> tuple[Path, Path]:
    """The generated corpus of about ``rows`` lines (kept in ``workdir`` between runs) and the
    tiny model trained on its first lines."""
    from pipeline.config.data_section import GENERATED_GROUP_SIZE
    from pipeline.data.synthetic import write_generated_corpus
    from pipeline.model.tiny import build_random_bert_dir

    corpus = workdir / f"corpus-{rows}.txt"
    if not corpus.exists() and rows > GENERATED_ROWS:
        # The generator's time grows with the square of its size (its vocabulary grows with
        # it): larger corpora are copies of the largest one it makes, each copy's lines led by
        # a word of its own, so every line is distinct (one token more a line). Each copy after
        # the first maps its words through a permutation of the vocabulary of its own: new
        # sentences with the same statistics, not near-duplicates of the first copy's lines (a
        # row's nearest would all be its copies, which an IVF index finds only by probing a
        # large share of its cells: 1,024 of 6,324 at 2.5M rows).
        base = prepare(workdir, GENERATED_ROWS)[0].read_text().splitlines()
        vocabulary = sorted({word for line in base for word in line.split()})
        with corpus.open("w") as out:
            for copy in range(-(-rows // len(base))):
                lines = base[: rows - copy * len(base)]
                if copy:
                    order = np.random.default_rng(copy).permutation(len(vocabulary))
                    word = dict(zip(vocabulary, (vocabulary[i] for i in order), strict=True))
                    lines = [" ".join(word[w] for w in line.split()) for line in lines]
                out.writelines(f"copy{copy} {line}\n" for line in lines)
    elif not corpus.exists():
        write_generated_corpus(corpus, max(1, rows // GENERATED_GROUP_SIZE))
    model = workdir / "tiny-model"
    if not (model / "config.json").exists():
        sample = workdir / f"corpus-{BASELINE_ROWS}.txt"
        if not sample.exists():
            write_generated_corpus(sample, BASELINE_ROWS // GENERATED_GROUP_SIZE)
        texts = [line.strip() for line in sample.read_text().splitlines() if line.strip()]
        build_random_bert_dir(texts, model, max_seq_len=32, dropout=0.1, seed=0)
    return corpus, model


def run_once(
    head: RayHead, trainers: RayWorkerNode, *, corpus: Path, model: Path, workers: int, workdir: Path
) -> dict[str, Any]:
    """One run until its first progress line: the driver's and each train worker's peak RSS and
    the object store's peak (bytes)."""
    run_dir = workdir / f"run-{corpus.stem}-w{workers}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = run_dir / "scale.yaml"
    config.write_text(CONFIG)
    overrides = [
        f"ray.address={head.address}", f"data.path={corpus}", f"model.name_or_path={model}",
        f"train.num_workers={workers}", f"run.storage_path={run_dir / 'storage'}",
        f"run.name=scale-{corpus.stem}-w{workers}", f"run.output_dir={run_dir / 'runs'}",
    ]  # fmt: skip
    job = RunningJob(
        run_dir, overrides, env=dict(head.env), config=str(config), holds=(f"train_step={HOLD_STEP}",)
    )
    node = psutil.Process(trainers.proc.pid)  # the trainer node's ray start: its workers descend from it
    driver = psutil.Process(job.proc.pid)

    def processes() -> list[int]:
        return [driver.pid, *(p.pid for p in titled(node, "RayTrainWorker"))]

    try:
        with ObjectStorePeak(head.address) as store, AnonPeaks(processes) as anon:
            job.wait_held(
                f"train_step={HOLD_STEP}",
                f"step {HOLD_STEP} of the run on {corpus.name} with {workers} workers",
                JOB_TIMEOUT_S,
            )
            workers_now = titled(node, "RayTrainWorker")
            worker_peaks = sorted(vm_hwm(p) for p in workers_now)
            driver_peak = vm_hwm(driver)
            time.sleep(0.5)  # one more sample of each
    except JobWaitError as exc:
        sys.exit(f"error: {exc}")
    finally:
        job.kill_all()  # also when the bench itself is interrupted: the job is its own session
    worker_anon = sorted(anon.peaks.get(p.pid, 0) for p in workers_now)
    if len(worker_peaks) != workers:
        sys.exit(f"error: found {len(worker_peaks)} train workers, expected {workers}")
    return {
        "driver": driver_peak, "workers": worker_peaks, "store": store.peak,
        "driver_anon": anon.peaks.get(driver.pid, 0), "workers_anon": worker_anon,
    }  # fmt: skip


def table(rows: list[int], workers: list[int], results: dict[tuple[int, int], dict[str, Any]]) -> str:
    """Peak RSS (``VmHWM``) and sampled peak ``RssAnon`` of the driver and the largest train
    worker, each above the 10,000-row run with the same W; the workers' data memory against W's first."""
    lines = [
        "| rows | W | driver peak RSS MiB | driver B/row (RSS / anon) | worker peak RSS MiB | worker data MiB (RSS / anon) | vs W=1 (RSS / anon) | object store peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip

    def data(size: int, w: int, key: str) -> float:
        return max(results[(size, w)][key]) - max(results[(BASELINE_ROWS, w)][key])

    for size in [BASELINE_ROWS, *rows]:
        for w in workers:
            got, base = results[(size, w)], results[(BASELINE_ROWS, w)]
            cells = [f"{size:,}", str(w), f"{got['driver'] / MIB:,.0f}"]
            if size == BASELINE_ROWS:
                cells += ["-", f"{max(got['workers']) / MIB:,.0f}", "-", "-"]
            else:
                per_row = [(got[k] - base[k]) / size for k in ("driver", "driver_anon")]
                rss, anon = data(size, w, "workers"), data(size, w, "workers_anon")
                first_rss, first_anon = (
                    data(size, workers[0], "workers"),
                    data(size, workers[0], "workers_anon"),
                )
                cells += [
                    f"{per_row[0]:.0f} / {per_row[1]:.0f}",
                    f"{max(got['workers']) / MIB:,.0f}",
                    f"{rss / MIB:,.0f} / {anon / MIB:,.0f}",
                    f"{rss / first_rss:.2f} / {anon / first_anon:.2f}",
                ]
            cells.append(f"{got['store'] / MIB:,.0f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--rows", default="1000000,4000000", help="corpus sizes, comma-separated")
    parser.add_argument(
        "--workers",
        default="1,2,4",
        help="train worker counts, comma-separated; the first is the ratios' base",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the generated corpora here (default: a temporary folder)",
    )
    # Not BENCHMARK.parse: its integer checks would read --rows and --workers as counts.
    args = parser.parse_args(argv)
    sizes = [int(r) for r in args.rows.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[int, int], dict[str, Any]] = {}
    head = RayHead(workdir / "cluster", num_cpus=2)
    try:
        trainers = RayWorkerNode(head, "trainers", num_cpus=TRAINER_CPUS, labels={"role": "trainer"})
        try:
            for size in [BASELINE_ROWS, *sizes]:
                corpus, model = prepare(workdir, size)
                for w in workers:
                    started = time.perf_counter()
                    results[(size, w)] = run_once(
                        head, trainers, corpus=corpus, model=model, workers=w, workdir=workdir
                    )
                    print(
                        f"[scale] {size:,} rows, W={w}: {time.perf_counter() - started:.0f}s {results[(size, w)]}",
                        flush=True,
                    )
        finally:
            trainers.stop()
    finally:
        head.stop()
    body = table(sizes, workers, results)
    print(body)
    if args.append:
        BENCHMARK.append(
            "memory against rows and workers", machine_report("ray", "torch"), body, args.append, argv
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
