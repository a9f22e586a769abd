"""One corpus refresh over S miner shards (issue 59): every process's peak memory, the
refresh's seconds by stage, and the index's recall@10 against exact search.

    python -m bench.sharded_miner --rows 1000000,3000000,10000000 --shards 1,2,4
    python -m bench.sharded_miner --task pairs --queries 100000 --rows 10000000 --shards 4

For each corpus size and S, on a local multi-node cluster (:mod:`bench.local_cluster`): a driver
process on the head tokenizes the generated corpus into the object store as the job does
(:func:`~pipeline.data.tokenize.tokenize_texts`, with the tiny model's tokenizer, trained once on
the corpus' first lines) and runs the miner over S shard actors
(:class:`~pipeline.mining.miner.HardNegativeMiner`, ``mining.shards`` = S), the shards on a
second node labelled ``role=miner`` (at S = 1 the one shard runs in the miner's process). The
miner is an actor of its own on that node, as in a job (:class:`BenchMiner`: the job's
:class:`~pipeline.mining.miner_actor.HardNegativeMinerActor` with the bench's questions added),
so the driver, the miner and each shard have peaks of their own. One refresh of the corpus task runs (``knn`` batches, the
index ``--index`` names, ``top_k`` 64, batch 64), with the tiny model after a few SimCSE steps
(:func:`warmed_model`; ``--random-model``: its random weights); then the
driver holds while the bench reads the peak RSS (``VmHWM``) of the driver and of each shard.
The object store's peak is the largest total of Ray's ``object_store_bytes_used``, polled
every second; ``RssAnon`` (the process's own heap, without object-store pages) is sampled every
0.2 s beside it.

``--task pairs`` runs the pairs task's refresh instead: ``--queries`` random rows of the corpus
are anchors (each with the next line as its positive) whose negatives are mined from the whole
corpus as the pool (``data.pool``), as a retrieval corpus of passages is mined for its queries
(ANCE: about 0.5M MS MARCO queries against 8.8M passages). Every text is still encoded and
indexed; only the anchors are searched.

``--model`` and ``--shard-gpus`` run it on a GPU machine (``bench/gpu_session.sh shards``: two
shards on the one GPU, BERT-base).

Recall@10, after the peaks are read: for 1,000 random rows, the index's top 10 against the exact
top 10 over every vector (fetched from the shards a chunk at a time), each row itself among both.
IVF's shards share their cells, and one ``nprobe`` is calibrated at every build to reach 0.95 on
a sample of 256 rows (:func:`pipeline.mining.index.calibrate_nprobe`; the table
shows it), so this checks that on rows it never saw.

On this 2-core machine the shards' encodes and searches share the same two cores, so seconds
at S > 1 say what the sharding costs (processes, merges), not what it gains: more machines
is what divides the work. Goals (issue 59): at 10M rows and S = 4 no process above 2 GiB peak
RSS; recall@10 at least 0.95.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import Benchmark, Sampler, machine_report, model_label, status_bytes
from bench.local_cluster import PYTHON, RayHead, RayWorkerNode
from bench.running_job import titled
from bench.scale import AnonPeaks, ObjectStorePeak, prepare, vm_hwm
from pipeline.mining.index import exact_top_k
from pipeline.mining.miner_actor import HardNegativeMinerActor

BENCHMARK = Benchmark("bench.sharded_miner", "Mining refresh over shards")
MIB = 2**20
READY = "[drive] refreshed "
RECALL = "[drive] recall@10 "
RECALL_QUERIES = 1_000
RECALL_CHUNK_ROWS = 32_768
TOP_K = 64
BATCH_SIZE = 64


def drive(args: argparse.Namespace) -> None:
    """The driver: tokenize, start the shards, refresh once, print the report, hold."""
    import ray

    from pipeline.config.data_section import DataSection
    from pipeline.data.corpus import load_clean_corpus
    from pipeline.data.tokenize import tokenize_texts
    from pipeline.data.triplets import Triplets
    from pipeline.mining.hard_negatives import SearchSettings
    from pipeline.mining.index import IndexSpec
    from pipeline.mining.miner_actor import miner_actor_options
    from pipeline.mining.miner_settings import MinerSettings
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import load_tokenizer, pack_dir
    from pipeline.training.contract import miner_inputs

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    started = time.perf_counter()
    section = DataSection(path=str(args.corpus), max_seq_len=32)
    distinct, _ = load_clean_corpus(section)
    blocks, _ = tokenize_texts(distinct, load_tokenizer(args.model), section)
    del distinct
    tokenize_seconds = time.perf_counter() - started
    settings = MinerSettings(
        pooler="mean", batch_size=BATCH_SIZE, seed=0,
        search=SearchSettings(top_k=TOP_K, index=IndexSpec(args.index)), batch_sampler="knn",
        shards=args.shards, num_cpus=1.0, num_gpus=args.shard_gpus, label_selector={"role": "miner"},
    )  # fmt: skip
    triplets = None
    if args.task == "pairs":
        n = blocks.num_rows
        anchor = np.sort(np.random.default_rng(0).choice(n, size=min(args.queries, n), replace=False))
        triplets = Triplets(
            anchor=anchor, positive=(anchor + 1) % n, negative=np.full(len(anchor), -1), pool=np.arange(n)
        )
    inputs = miner_inputs(
        blocks, ray.put(pack_dir(args.model)), None if triplets is None else ray.put(triplets)
    )
    miner = ray.remote(BenchMiner).options(**miner_actor_options(settings)).remote(settings)
    miner_pid = ray.get(miner.ready.remote(inputs))
    weights = load_sentence_encoder(args.model, pooler="mean").encoder.state_dict()
    report = ray.get(miner.refresh.remote(inputs, weights, 1, 0))
    shard_pids, nprobe = ray.get(miner.shards_ready.remote())
    print(
        READY
        + json.dumps(
            {
                "tokenize_s": tokenize_seconds,
                "miner_pid": miner_pid,
                "shard_pids": shard_pids,
                "nprobe": nprobe,
                **report.metrics,
            }
        ),  # fmt: skip
        flush=True,
    )
    sys.stdin.readline()  # the bench reads every peak meanwhile, before the recall's own arrays
    print(RECALL + json.dumps(ray.get(miner.index_recall.remote(1))), flush=True)
    sys.stdin.readline()
    ray.get(miner.stop_shards.remote())


class BenchMiner(HardNegativeMinerActor):
    """The job's miner actor with the bench's questions, asked where the miner runs."""

    def shards_ready(self) -> tuple[list[int], int]:
        """Each shard's process id, and the ``nprobe`` they were calibrated to."""
        assert self.miner is not None
        return self.miner.shards.ask_all("ready"), self.miner.shards.nprobe

    def index_recall(self, seed: int) -> float:
        """:func:`index_recall` of the shards."""
        assert self.miner is not None
        return index_recall(self.miner.shards, seed=seed)

    def stop_shards(self) -> None:
        assert self.miner is not None
        self.miner.shards.stop()


def index_recall(texts: Any, *, seed: int, k: int = 10) -> float:
    """Mean share of each sampled row's exact top ``k`` (every vector, a chunk at a time) that
    the index's top ``k`` holds."""
    rng = np.random.default_rng(seed)
    queries = np.sort(rng.choice(texts.rows, size=min(RECALL_QUERIES, texts.rows), replace=False))
    query_vectors = texts.vectors(queries)
    _, found = texts.search(query_vectors, k)
    _, best_rows = exact_top_k(query_vectors, texts.vectors, texts.rows, k, block_rows=RECALL_CHUNK_ROWS)
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, best_rows, strict=True)]
    return float(np.mean(hits)) / k


class WorkerPeaks(Sampler):
    """The largest peak RSS (``VmHWM``) and ``RssAnon`` of every other Ray worker process on
    the cluster's nodes (Ray Data's readers and tokenizers, pooled idle workers), sampled every
    0.5 s, each with the title it had then: short-lived workers are gone before the end."""

    def __init__(self, nodes: list[psutil.Process], skip: Any):
        super().__init__(0.5)
        self.nodes, self.skip = nodes, skip
        self.rss: dict[int, tuple[int, str]] = {}
        self.anon: dict[int, int] = {}

    def sample(self) -> None:
        skipped = set(self.skip())
        for node in self.nodes:
            for worker in titled(node, "ray::"):
                if worker.pid in skipped:
                    continue
                rss = status_bytes(worker.pid, "VmHWM")
                with contextlib.suppress(psutil.Error):
                    if rss > self.rss.get(worker.pid, (0, ""))[0]:
                        self.rss[worker.pid] = (rss, " ".join(worker.cmdline()).split(" ")[0])
                self.anon[worker.pid] = max(self.anon.get(worker.pid, 0), status_bytes(worker.pid, "RssAnon"))

    def largest(self) -> tuple[int, int, str]:
        """The largest peak RSS, the largest own heap, and the title at the largest RSS."""
        if not self.rss:
            return 0, 0, ""
        rss, title = max(self.rss.values())
        return rss, max(self.anon.values(), default=0), title


WARM_STEPS = 300


def warmed_model(workdir: Path, random_model: Path, corpus: Path) -> Path:
    """The tiny model after :data:`WARM_STEPS` unsupervised SimCSE steps (batch 64, lr 1e-3) on
    the corpus' first 50,000 lines, kept in ``workdir``. A random-weights model's vectors all
    point one way (any two rows 0.98 similar), IVF's worst case: at 10M rows its calibrated
    nprobe reached about a third of the cells. These steps spread them (0.04 on average), as
    any trained model's are."""
    import torch

    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import load_tokenizer, save_model_dir
    from pipeline.training.losses import simcse_loss

    out = workdir / "tiny-model-simcse"
    if (out / "config.json").exists():
        return out
    with corpus.open() as lines:
        texts = [line.strip() for _, line in zip(range(50_000), lines, strict=False) if line.strip()]
    tokenizer = load_tokenizer(random_model)
    model = load_sentence_encoder(random_model, pooler="mean", dropout=0.1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    for _ in range(WARM_STEPS):
        batch = tokenizer(
            [texts[i] for i in rng.choice(len(texts), size=64, replace=False)],
            padding=True, truncation=True, max_length=32, return_tensors="pt",
        )  # fmt: skip
        views = [model(batch["input_ids"], batch["attention_mask"], train_head=False) for _ in range(2)]
        loss = simcse_loss(*views)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return save_model_dir(model.eval(), tokenizer, out, max_seq_len=32)


def run_once(
    head: RayHead,
    miners: RayWorkerNode,
    *,
    corpus: Path,
    model: Path,
    shards: int,
    index: str,
    shard_gpus: float,
    task: str,
    queries: int,
) -> dict:
    """One driver process: its report, and the peaks of the driver and of each shard."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "bench.sharded_miner", "--drive", "--address", head.address, "--corpus", str(corpus),
         "--model", str(model), "--shards", str(shards), "--index", index, "--shard-gpus", str(shard_gpus),
         "--task", task, "--queries", str(queries)],
        env=dict(head.env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    driver = psutil.Process(proc.pid)
    node = psutil.Process(miners.proc.pid)

    def processes() -> list[int]:
        return [
            driver.pid,
            *(p.pid for p in titled(node, "BenchMiner")),
            *(p.pid for p in titled(node, "MinerShard")),
        ]

    try:
        with (
            ObjectStorePeak(head.address) as store,
            AnonPeaks(processes) as anon,
            WorkerPeaks([psutil.Process(head.proc.pid), node], processes) as workers,
        ):
            result = json.loads(read_until(proc, READY))
            peaks = {"driver": vm_hwm(driver), "miner": vm_hwm(psutil.Process(result["miner_pid"]))}
            for number, pid in enumerate(result["shard_pids"]):
                peaks[f"shard {number}"] = vm_hwm(psutil.Process(pid))
            time.sleep(0.5)  # one more sample of each
            answer(proc)
        result["recall_at_10"] = json.loads(read_until(proc, RECALL))
        answer(proc)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    anon_peaks = {"driver": anon.peaks.get(driver.pid, 0), "miner": anon.peaks.get(result["miner_pid"], 0)}
    for number, pid in enumerate(result["shard_pids"]):
        anon_peaks[f"shard {number}"] = anon.peaks.get(pid, 0)
    return {**result, "peaks": peaks, "anon": anon_peaks, "store": store.peak, "workers": workers.largest()}


def read_until(proc: subprocess.Popen, marker: str) -> str:
    """The rest of the driver's first output line that starts with ``marker`` (its other lines
    echoed)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith(marker):
            return line[len(marker) :]
    sys.exit(f"error: the driver ended with {proc.wait()} before it printed {marker.strip()!r}")


def answer(proc: subprocess.Popen) -> None:
    """Let the holding driver go on."""
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


STAGES = ("tokenize", "encode", "index", "partition", "search", "filter", "plan", "total")


def table(results: dict[tuple[int, int], dict[str, Any]]) -> str:
    """One line a run: seconds by stage, the largest peak of each kind of process, recall."""
    lines = [
        "| rows | S | " + " | ".join(f"{s} s" for s in STAGES)
        + " | partitions | driver peak MiB (RSS / anon) | miner peak MiB (RSS / anon) | largest shard peak MiB (RSS / anon) | largest other Ray worker peak MiB (RSS / anon, whose) | object store peak MiB | nprobe | recall@10 |",
        "|---|---|" + "---|" * (len(STAGES) + 8),
    ]  # fmt: skip
    for (rows, shards), got in sorted(results.items()):
        shard_keys = [key for key in got["peaks"] if key.startswith("shard")]
        cells = [
            f"{rows:,}",
            str(shards),
            *(f"{got.get(f'mining/{s}_s', got.get(f'{s}_s', 0.0)):.1f}" for s in STAGES),
        ]
        cells += [
            f"{got.get('mining/partitions', 0):.0f}",
            f"{got['peaks']['driver'] / MIB:,.0f} / {got['anon']['driver'] / MIB:,.0f}",
            f"{got['peaks']['miner'] / MIB:,.0f} / {got['anon']['miner'] / MIB:,.0f}",
            f"{max(got['peaks'][k] for k in shard_keys) / MIB:,.0f} / {max(got['anon'][k] for k in shard_keys) / MIB:,.0f}",
            "{:,.0f} / {:,.0f} ({})".format(got["workers"][0] / MIB, got["workers"][1] / MIB, got["workers"][2].removeprefix("ray::")),
            f"{got['store'] / MIB:,.0f}",
            f"{got['nprobe']:,}" if got.get("nprobe") else "-",
            f"{got['recall_at_10']:.3f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--rows", default="1000000", help="corpus sizes, comma-separated")
    parser.add_argument("--shards", default="1,2,4", help="shard counts, comma-separated")
    parser.add_argument("--index", default="ivf", choices=["flat", "ivf", "ivfpq", "auto"])
    parser.add_argument("--task", default="corpus", choices=["corpus", "pairs"])
    parser.add_argument("--queries", type=int, default=100_000, help="pairs task: anchors searched")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the generated corpora here")
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder (default: the tiny BERT, its tokenizer trained here)",
    )
    parser.add_argument(
        "--shard-gpus",
        type=float,
        default=0.0,
        help="GPUs of each shard (the miners' node gets the machine's one)",
    )
    parser.add_argument(
        "--random-model",
        action="store_true",
        help="the tiny model with its random weights (default: after a few SimCSE steps)",
    )
    parser.add_argument(
        "--head-cpus",
        type=int,
        default=2,
        help="CPUs of the head node, where the corpus is tokenized (2: this machine's cores)",
    )
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        args.shards = int(args.shards)
        drive(args)
        return 0
    sizes = [int(r) for r in args.rows.split(",")]
    shard_counts = [int(s) for s in args.shards.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sharded-miner-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[int, int], dict[str, Any]] = {}
    head = RayHead(workdir / "cluster", num_cpus=args.head_cpus)
    try:
        miners = RayWorkerNode(
            head,
            "miners",
            num_cpus=max(shard_counts) + 1,  # the shards, and the miner's own
            num_gpus=int(args.shard_gpus > 0),
            labels={"role": "miner"},
        )
        try:
            for size in sizes:
                corpus, tiny = prepare(workdir, size)
                if not (args.model or args.random_model):
                    tiny = warmed_model(workdir, tiny, corpus)
                for shards in shard_counts:
                    started = time.perf_counter()
                    results[(size, shards)] = run_once(
                        head, miners, corpus=corpus, model=args.model or tiny, shards=shards, index=args.index,
                        shard_gpus=args.shard_gpus, task=args.task, queries=args.queries,
                    )  # fmt: skip
                    print(
                        f"[sharded_miner] {size:,} rows, S={shards}: {time.perf_counter() - started:.0f}s",
                        flush=True,
                    )
        finally:
            miners.stop()
    finally:
        head.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    body = table(results)
    print(body)
    if args.append:
        model = (
            model_label(args.model)
            if args.model
            else "tiny BERT" + (" (random)" if args.random_model else "")
        )
        task = "corpus task" if args.task == "corpus" else f"pairs task, {args.queries:,} anchors"
        title = (
            f"one refresh over shards, {task}, {model}, {args.index} index, top_k {TOP_K}, batch {BATCH_SIZE}"
        )
        BENCHMARK.append(title, machine_report("ray", "torch", "faiss"), body, args.append, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
