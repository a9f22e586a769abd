"""Shared fixtures: a tiny model and corpus made here (no network, no ../shared), and a
local Ray started for real with its temp files under pytest's tmp dir."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from crash_report import pytest_handlecrashitem, ray_session_noted  # noqa: F401 (registers the hook)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def load_script(relative_path: str, name: str):
    """A script of the repository (``jobs/*.py``: not an installed package),
    imported as module ``name`` and registered in ``sys.modules`` (dataclasses look their
    module up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_script_in_process(
    relative_path: str,
    argv: list[str],
    *,
    cwd: Path,
    capfd,
    monkeypatch,
    actor_output: bool = False,
) -> subprocess.CompletedProcess:
    """``main(argv)`` of a job script in this test process, in ``cwd``, with no ``MLFLOW_*``
    variable and the environment as it was afterwards: on the test process's Ray when the
    test holds ``ray_local`` (no Ray start and no imports of its own: about 20 s of CPU less
    than a process of its own). For jobs that run the same either way: the seams a test sets
    here reach the job's actors in their runtime_env, and :class:`KillWhenHeld` kills one of
    them; a job whose driver a test kills, or that needs a Ray of its own, runs as a process
    of its own.

    Ray forwards what its actors print to this process some time later, so ``main`` returns
    before their lines have surely arrived. With ``actor_output`` the stdout returned ends with
    what the job's actors wrote to their Ray log files while ``main`` ran, which is complete
    when it returns (their processes wrote it before the job's end)."""
    name = "in_process_" + Path(relative_path).stem
    module = sys.modules.get(name) or load_script(relative_path, name)
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(cwd)
    capfd.readouterr()  # what earlier tests left
    logs_before = _actor_logs() if actor_output else {}
    environment = dict(os.environ)
    try:
        code = module.main(argv)
    finally:  # what the job set for itself (MLflow's retry count, Ray's switches) ends with it
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        os.environ.update(environment)
    out, err = capfd.readouterr()
    if actor_output:
        written = "".join(text[len(logs_before.get(path, "")) :] for path, text in _actor_logs().items())
        # Ray's markers of which job and actor a log belongs to (its console leaves them out)
        out += "".join(line for line in written.splitlines(keepends=True) if not RAY_LOG_MARKER.match(line))
    return subprocess.CompletedProcess([relative_path, *argv], code, out, err)


RAY_LOG_MARKER = re.compile(r":(job_id|actor_name|task_name):")


class KillWhenHeld:
    """Sets the hold seam (:func:`pipeline.core.seams.hold_once`) at ``point`` for a job run in
    this process (:func:`run_script_in_process`), and SIGKILLs the process that holds there,
    from a thread, once it does. The thread waits for the hold or for :meth:`killed_pid`, the
    test's word that the job has ended, never for a clock: on a loaded machine the hold can
    come many minutes after the job started, and a killer that gave up earlier left the job
    held until its own timeout."""

    def __init__(self, monkeypatch, hold_dir: Path, point: str):
        from pipeline.core.seams import HOLD_DIR_ENV, HOLD_ENV

        hold_dir.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(HOLD_ENV, point)
        monkeypatch.setenv(HOLD_DIR_ENV, str(hold_dir))
        self.point = point
        self._job_ended = threading.Event()
        self._killed: int | None = None
        # A daemon: a test that fails before its job ends leaves nothing for pytest's exit to join.
        self._thread = threading.Thread(target=self._kill_when_held, args=(hold_dir, point), daemon=True)
        self._thread.start()

    def _kill_when_held(self, hold_dir: Path, point: str) -> None:
        from bench.running_job import held_pid

        while not self._job_ended.is_set():
            pid = held_pid(hold_dir, point)
            if pid:
                os.kill(pid, signal.SIGKILL)
                self._killed = pid
                return
            self._job_ended.wait(0.05)  # a poll of the hold's file, cut short by the job's end

    def killed_pid(self) -> int:
        """Once the job has ended: the pid killed. Fails the test if nothing held there."""
        self._job_ended.set()
        self._thread.join(timeout=30)
        assert self._killed is not None, f"no process of the job held at {self.point}"
        return self._killed


def _actor_logs() -> dict[Path, str]:
    """What the workers of this process's Ray session wrote to stdout so far, by log file."""
    import ray

    if not ray.is_initialized():
        return {}
    return {
        path: path.read_text(errors="replace") for path in (ray_session_dir() / "logs").glob("worker-*.out")
    }


def ray_session_dir() -> Path:
    """The session folder of the Ray this process is connected to."""
    import ray

    return Path(ray._private.worker._global_node.get_session_dir_path())  # no public accessor


@pytest.fixture(scope="session")
def paraphrase_corpus():
    from pipeline.data.synthetic import generate_paraphrase_corpus

    return generate_paraphrase_corpus(num_groups=300, seed=3)


@pytest.fixture(scope="session")
def paraphrase_pairs(paraphrase_corpus):
    """(anchors, positives): two pairs from each of 150 paraphrase groups (members 1->2, 2->3)."""
    import numpy as np

    texts, groups = paraphrase_corpus
    anchors, positives = [], []
    for g in np.unique(groups)[:150]:
        members = [t for t, gg in zip(texts, groups, strict=True) if gg == g]
        anchors += members[:2]
        positives += members[1:3]
    return anchors, positives


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, paraphrase_corpus):
    from pipeline.model.tiny import BertShape, build_random_bert_dir

    texts, _ = paraphrase_corpus
    # Smaller than the jobs' TINY_BERT, so the many tests on it stay quick.
    shape = BertShape(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=600)
    return build_random_bert_dir(
        texts, tmp_path_factory.mktemp("tiny_model"), max_seq_len=32, dropout=0.1, seed=0, shape=shape
    )


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT as a one-label sequence classifier, its head seeded."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    out = tmp_path_factory.mktemp("tiny_cross_encoder")
    model.save_pretrained(out)
    # A pair's limit, as a cross-encoder's tokenizer states it (512 for BERT's).
    AutoTokenizer.from_pretrained(tiny_model_dir, model_max_length=64).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tokenized_corpus(tiny_model_dir, paraphrase_corpus):
    """(arrow table with id/text/input_ids sorted by id, group label per row)."""
    import numpy as np

    from pipeline.data.normalize import with_text_keys
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.utf8 import stable_row_id
    from pipeline.model.folders import load_tokenizer

    texts, groups = paraphrase_corpus
    ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
    order = np.argsort(ids)
    table = pa.table({"id": ids[order], "text": [texts[i] for i in order]})
    return with_text_keys(tokenize_table(table, load_tokenizer(tiny_model_dir), 32)), groups[order]


@pytest.fixture(scope="session")
def sorted_blocks(ray_local, tmp_path_factory, tiny_model_dir, paraphrase_corpus):
    """The paraphrase corpus tokenized into several id-sorted blocks in the object store, with
    the distinct texts and the tokenizer."""
    from pipeline.config.data_section import DataSection
    from pipeline.data.corpus import load_clean_corpus
    from pipeline.data.tokenize import tokenize_texts
    from pipeline.model.folders import load_tokenizer

    texts, _ = paraphrase_corpus
    path = tmp_path_factory.mktemp("share") / "c.txt"
    path.write_text("\n".join(texts))
    section = DataSection(path=str(path), max_seq_len=16)
    tokenizer = load_tokenizer(tiny_model_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pipeline.data.tokenize.ROWS_PER_BATCH", 50)
        patch.setattr("pipeline.data.text_blocks.RANGE_ROWS", 97)  # several blocks, the last shorter
        distinct, _ = load_clean_corpus(section)
        blocks, _ = tokenize_texts(distinct, tokenizer, section)
    return blocks, distinct.gather(), tokenizer


def _on_rank(rank: int, port: int, work, args: tuple, out) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result = work(rank, *args)
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def run_on_two_ranks(work, *args, timeout: float = 120):
    """``work(rank, *args)`` in two spawned processes joined as gloo ranks (a process group of
    2, as two DDP workers): rank 0's return value. ``work`` must be a module-level function."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=_on_rank, args=(rank, port, work, args, out)) for rank in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=timeout)
    for p in procs:
        p.join(timeout=60)
    return result


def text_keys(*text_lists: list[str]) -> list[np.ndarray]:
    """Integer keys, one per :func:`~pipeline.data.normalize.normalize_text` value, shared
    across the given lists: the miner's keys (``dense_keys`` of hashed ones) computed apart."""
    from pipeline.data.normalize import normalize_text

    keys: dict[str, int] = {}
    return [
        np.array([keys.setdefault(normalize_text(t), len(keys)) for t in texts], dtype=np.int64)
        for texts in text_lists
    ]


def blocks_of(table: pa.Table):
    """A tokenized table (``id``, ``input_ids``, ``text_key``, sorted by id) as the job hands
    the corpus to the miner: one block in the object store of the Ray this process is on
    (a test that calls it holds ``ray_local``)."""
    import pyarrow.compute as pc
    import ray

    from pipeline.data.tokenized import TokenizedBlocks

    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False).astype("int32")
    return TokenizedBlocks([ray.put(table)], (table.num_rows,), ray.put(lengths))


def write_beir(
    folder: Path,
    queries: dict[str, str],
    docs: dict[str, str],
    qrels: list[tuple[str, str, int]],
    split: str = "dev",
) -> Path:
    """A BEIR retrieval folder: ``queries.jsonl`` (id: text), ``corpus.jsonl`` (id: text, empty
    titles) and ``qrels/<split>.tsv`` (query id, document id, grade) with its header row."""
    import json

    (folder / "qrels").mkdir(parents=True)
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items())
    )
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items())
    )
    rows = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{grade}" for q, d, grade in qrels]
    (folder / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray started as a job starts its own (:func:`pipeline.runtime.cluster.ray_session`): on
    free ports, never joining another Ray that runs on the machine. One for the whole session (one
    per test process under pytest-xdist): starting Ray is not what the tests that use it test,
    and each start costs seconds."""
    import ray

    from pipeline.config.loading import load_config
    from pipeline.runtime.cluster import ray_session

    with ray_session(load_config(None, ["ray.num_cpus=4"])), ray_session_noted(str(ray_session_dir())):
        yield ray


def unexpected_alarming_lines(text: str, killed_pids: tuple[int, ...] = ()) -> list[str]:
    """The error-level lines and tracebacks of a job's output that a healthy run does not print.
    The exceptions are Ray's own (docs/operations.md, "Console lines left in on purpose"): Ray
    Train 2.60's PreemptionWatcher actor makes Ray print the restart warning that our miner no
    longer causes; a busy machine sometimes makes a pooled Ray worker report an RPC meant
    for the worker process before it, which it ignores; and Ray 2.60 sometimes aborts a pooled
    worker that it is ending for being idle (a corrupt mutex in its shutdown, after its tasks
    are done, with SIGABRT or SIGSEGV), whose fatal-signal report is accepted only where that
    worker's own Ray log shows the signal after the idle exit (:func:`idle_exit_aborts`). Where
    a test killed a process, the raylet's one report of that death (naming its pid) is
    expected, and so is its note that a reply to the dead worker found the connection reset."""
    alarming = [line for line in text.splitlines() if " E " in line or "ERROR" in line or "Traceback" in line]
    reported = [f"Worker PID: {pid} " for pid in killed_pids]
    idle_aborts = idle_exit_aborts(alarming)
    return [
        line for line in alarming
        if not (
            "'PreemptionWatcher'" in line
            or "Mismatched WorkerID: ignoring RPC for previous worker" in line
            or ("A worker died or was killed" in line and any(pid in line for pid in reported))
            or (bool(killed_pids) and "(raylet)" in line and "Connection reset by peer" in line)
            or fatal_signal_pid(line) in idle_aborts
        )
    ]  # fmt: skip


_FATAL_SIGNAL_LINE = re.compile(r"\bpid=(\d+)\)\S*\s.* logging\.cc:\d+: ")
"""A line of Ray's fatal-signal handler (``logging.cc``) forwarded from a worker: ``(name pid=N) ...``,
where the name may hold parentheses of its own (``SortShuffleMap(partitions=1)``)."""


def fatal_signal_pid(line: str) -> int | None:
    """The pid of the worker whose fatal-signal report ``line`` forwards; None: not such a line."""
    found = _FATAL_SIGNAL_LINE.search(line)
    return int(found[1]) if found else None


_WORKER_LOG = re.compile(r"python-core-worker-\w+_(\d+)\.log")
"""A Ray worker's own log, named by its pid."""


def idle_exit_aborts(lines: list[str], roots: tuple[Path, ...] = (Path("/tmp"),)) -> set[int]:
    """The pids among ``lines``' fatal-signal reports whose Ray worker log (any Ray session's
    ``python-core-worker-*_<pid>.log`` under ``roots``) shows it was ending as an idle pooled
    worker when it crashed: Ray's own shutdown crash, not a task's. A report whose log cannot be
    found stays alarming."""
    pids = {pid for pid in map(fatal_signal_pid, lines) if pid is not None}
    if not pids:
        return set()
    found: set[int] = set()
    skip = {".venv", ".git", "site-packages", "node_modules", "__pycache__", "runtime_resources"}
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = [name for name in subfolders if name not in skip]
            if not folder.endswith("logs"):
                continue
            for name in files:
                named = _WORKER_LOG.fullmatch(name)
                if named and int(named[1]) in pids - found:
                    log = (Path(folder) / name).read_text(errors="replace")
                    if _FATAL_AFTER_IDLE_EXIT.search(log):
                        found.add(int(named[1]))
    return found


_FATAL_AFTER_IDLE_EXIT = re.compile(
    r"Worker exited because it was idle.*\*\*\* SIG(ABRT|SEGV) received", re.DOTALL
)
"""Ray 2.60's shutdown crash of an idle pooled worker, after its exit began: an abort on a corrupt
mutex, or (2026-12-02, CI) a segfault of its metrics harvester thread on a mutex already
destroyed, after "Core worker is destructed". Any signal before the idle exit is a task's."""


def assert_no_alarming_lines(proc: subprocess.CompletedProcess, killed_pids: tuple[int, ...] = ()) -> None:
    """A healthy run prints no error-level line and no traceback but the expected ones
    (:func:`unexpected_alarming_lines`)."""
    unexpected = unexpected_alarming_lines(proc.stdout + proc.stderr, killed_pids)
    assert not unexpected, unexpected


def keep_ray_logs(ray_root: Path, into: Path) -> Path:
    """Copy the ``logs`` folders of every Ray session under ``ray_root`` (a ``RAY_TMPDIR``'s
    ``ray`` folder) into ``into``, before a test removes them: what a crashed Ray worker wrote
    (its ``worker-*.err``, the raylet's log) is the only trace of why. Sockets and other
    non-files are skipped. Returns ``into``."""
    import shutil

    for logs in ray_root.glob("session_*/logs"):
        if logs.parent.is_symlink():
            continue  # session_latest: the same folder again
        for path in logs.rglob("*"):
            if path.is_file() and not path.is_symlink():
                target = into / logs.parent.name / "logs" / path.relative_to(logs)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return into


def assert_clean_negatives(rows: list[dict], num_negatives: int) -> None:
    """Rows as ``jobs/mine.py`` writes them: each has ``num_negatives`` distinct non-empty
    negatives, none of them (after normalization) its anchor or its positive."""
    from pipeline.mining.text_keys import normalize_text

    for row in rows:
        negatives = [row[f"negative_{j + 1}"] for j in range(num_negatives)]
        forbidden = {normalize_text(row["anchor"]), normalize_text(row["positive"])}
        assert all(isinstance(n, str) and n for n in negatives)
        assert not forbidden & {normalize_text(n) for n in negatives}
        assert len(set(negatives)) == num_negatives


@pytest.fixture(scope="session")
def trained_tiny_model_dir(tmp_path_factory, tiny_model_dir, paraphrase_corpus):
    """The tiny model after 3 quick SimCSE epochs in-process: a random BERT is anisotropic
    (all cosines ~0.98), which makes every similarity-based check meaningless."""
    import torch

    from pipeline.batching.samplers import random_plan
    from pipeline.data.tokenize import tokenize_table
    from pipeline.data.tokenized import TokenizedCorpus
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.model.folders import load_tokenizer, save_model_dir
    from pipeline.training.losses import simcse_loss

    texts, _ = paraphrase_corpus
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_sentence_encoder(tiny_model_dir, pooler="mean", dropout=0.1)
    corpus = TokenizedCorpus(tokenize_table(pa.table({"text": texts}), tokenizer, 32), tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(0)
    model.train()
    for epoch in range(3):
        for rows in random_plan(len(texts), 48, seed=epoch).batches():
            ids, mask = (torch.from_numpy(a) for a in corpus.batch(rows))
            view1, view2 = model(torch.cat([ids, ids]), torch.cat([mask, mask])).split(len(rows))
            loss = simcse_loss(view1, view2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return save_model_dir(model, tokenizer, tmp_path_factory.mktemp("trained_tiny"), 32)


def pytest_configure(config):
    """Under pytest-xdist (``make test``), each test process keeps torch to one thread: two
    processes with a thread per core each would oversubscribe the cores, and OpenMP's waiting
    threads spin."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """A test that uses the session's Ray is ``slow`` whether or not it says so: ``make
    test-fast`` (``-m "not slow"``) then starts no Ray cluster at all. Tests marked ``job``
    run first (in their own order): started last, a three-minute test keeps one test process
    busy long after the other has run out of work."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("job") is None)
