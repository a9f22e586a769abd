"""Per-worker compute benchmark: one SimCSE train step, corpus encoding and k-NN search.

    python -m bench.gpu_step                                   # BERT-base on the GPU, if there is one
    python -m bench.gpu_step --size tiny                       # seconds on a 2-core CPU
    python -m bench.gpu_step --compile --append docs/benchmarks.md --json gpu_step.json
    python -m bench.gpu_step --batch 1024 --phases 20           # + where a step's time goes

Measures what one Ray Train worker and the miner spend their time on, without Ray, so it
runs on any machine with torch, numpy, transformers and pyarrow (faiss optional):

- train step: unsupervised SimCSE as ``pipeline.training.worker.SimCSEWorker`` runs it, through
  the pipeline's own step, ``pipeline.training.unsupervised_step.UnsupervisedStep``
  (temperature 0.05, no word repetition). A ``pipeline.data.tokenized.TokenizedCorpus`` of
  random token ids (every row ``--seq-len`` tokens, so the token count is exact) is cut into
  ``--batch``-row batches by ``pipeline.batching.samplers.random_plan``; each batch goes through
  ``pipeline.model.encoder.SentenceEncoder`` (mean pooling, no MLP head) twice, stacked in one
  forward pass, then ``global_batch_simcse_loss``, and the worker's own optimizer step
  (``pipeline.training.step.OptimizerStep``: backward, ``clip_grad_norm_``, AdamW, linear
  schedule). On CUDA, through ``pipeline.accel`` as the train loop does: bf16 autocast,
  TF32 matmuls, host batches copied from pinned memory asynchronously; and fused AdamW.
  The timed steps run on batches collated before timing (``UnsupervisedStep.collate``), so
  they leave out the host-side collation; ``--phases`` times it. Reports
  sentences/s, tokens/s (both views) and MFU: model FLOP/s as the train loop counts them
  (``pipeline.model.flops``: 6 x non-embedding params per token plus the attention scores,
  under 1% more at 32 tokens) over the device's peak.
- encode: ``pipeline.model.encode.encode_rows`` (eval mode, bf16 autocast on CUDA, length-sorted
  batches padded to their own longest row) over random sentences of 8 to ``--seq-len``
  tokens, inside ``torch.inference_mode``.
- k-NN: ``pipeline.mining.index.VectorIndex`` (``bench.embedded_texts.vector_index``) over random unit vectors, built once and searched
  with the first ``--knn-queries`` of them. Where faiss is not installed it uses the index
  module's torch matmul + top-k search (``pipeline.mining.index.torch_top_k``), on CUDA or on
  the CPU.

With ``--phases N``, N more steps are timed phase by phase (host collation, host-to-device
copy, forward, loss, backward, gradient clipping, optimizer, loss read: the step's own
stages, ``UnsupervisedStep.collate``, ``.upload``, ``.forward`` and ``.loss``, then
``OptimizerStep.backward``, ``.clip`` and ``.step``), synchronising the device at each boundary; their rows follow the
others in the table.

Prints a header and one markdown table; ``--append FILE`` appends them with the machine,
the command line and the date, ``--json PATH`` writes the numbers as JSON. ``--compile``
runs the encoder through ``torch.compile``; where that fails (no working C++ compiler, an
unsupported torch) it warns once and goes on eager. MFU needs the device's peak:
``--peak-tflops``, by default the dense bf16 datasheet figure of an H100/H200, else n/a.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel, get_linear_schedule_with_warmup

# None of these imports Ray or MLflow at module level (faiss is imported inside the index;
# pipeline.data.tokenized needs pyarrow).
from bench.common import (
    FIRST_WORD_ID,
    GIB,
    Benchmark,
    command_line,
    machine_line,
)
from bench.common import machine_info as report_machine_info
from bench.embedded_texts import vector_index
from pipeline.batching.plan import BatchPlan
from pipeline.batching.samplers import random_plan
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.mining.index import torch_top_k
from pipeline.model.accel import enable_tf32, fused_adamw
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import SentenceEncoder
from pipeline.model.flops import EncoderFlops, datasheet_peak_tflops
from pipeline.training.global_batch import GlobalBatch
from pipeline.training.step import OptimizerStep
from pipeline.training.unsupervised_step import UnsupervisedStep

BENCHMARK = Benchmark(__spec__.name, "Per-worker compute: train step, encode, k-NN")
SIZES = {
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
}
VOCAB_SIZE = 30522
TEMPERATURE = 0.05
LR = 3e-5
MAX_GRAD_NORM = 1.0


def build_model(size: str, seq_len: int) -> SentenceEncoder:
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=max(512, seq_len),
        attn_implementation="sdpa",
        **SIZES[size],
    )
    encoder = BertModel(config, add_pooling_layer=False)
    return SentenceEncoder(encoder, pooler="mean", use_mlp=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CompileGuard:
    """Swaps the encoder for its ``torch.compile`` version and back to eager when compiling fails.

    Compilation happens lazily, at the first call of each new graph (train mode, then eval
    under inference mode), so each phase runs its first call through :meth:`run`.
    """

    def __init__(self, model: SentenceEncoder, enabled: bool):
        self.model = model
        self.eager = model.encoder
        self.state = "off"
        if enabled:
            try:
                model.encoder = torch.compile(self.eager)
                self.state = "on"
            except Exception as exc:
                self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        print(f"warning: torch.compile failed, running eager ({type(exc).__name__}: {first})", flush=True)
        self.model.encoder = self.eager
        self.state = "failed, eager"

    def run(self, fn: Callable[[], Any]) -> Any:
        if self.state != "on":
            return fn()
        try:
            return fn()
        except Exception as exc:
            self._fall_back(exc)
            return fn()


def train_inputs(args: argparse.Namespace, device: torch.device) -> tuple[UnsupervisedStep, BatchPlan]:
    """The pipeline's unsupervised step over a corpus of rows of exactly ``--seq-len`` tokens,
    and the train loop's random plan over it: at least 4 batches, all of ``--batch`` rows."""
    corpus = random_corpus(args.batch * max(4, -(-1024 // args.batch)), args.seq_len, args.seq_len, seed=2)
    plan = random_plan(len(corpus), args.batch, seed=0)
    return UnsupervisedStep(corpus, TEMPERATURE, dup_rate=0.0, device=device), plan


def bench_train(
    model: SentenceEncoder, guard: CompileGuard, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    cuda = device.type == "cuda"
    optimizer = fused_adamw(model, LR, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.warmup + 1 + args.steps)
    optimizer_step = OptimizerStep(model, optimizer, scheduler, MAX_GRAD_NORM)

    train_step, plan = train_inputs(args, device)
    sizes, rank = [args.batch], 0  # one worker holds the whole global batch
    augment_rng = np.random.default_rng(0)  # drawn from only with word repetition (dup_rate > 0)
    # Collated before timing, so the timed steps do not include the host-side batch building
    # (the train loop's collation runs on the CPU); cycled, so consecutive steps differ.
    # The step's own upload moves them (pinned, asynchronous on CUDA) each step.
    batches = [train_step.collate(GlobalBatch(plan.batch(i), sizes, rank), augment_rng) for i in range(4)]

    model.train()

    def step(i: int, phases: PhaseTimer | None = None) -> float:
        mark = phases.mark if phases is not None else (lambda _name: None)
        if phases is not None:
            phases.start()
            # The train loop's collation: the plan's rows padded into both views.
            batch = train_step.collate(
                GlobalBatch(plan.batch(i % plan.num_batches), sizes, rank), augment_rng
            )
            mark("collate (host)")
        else:
            batch = batches[i % len(batches)]
        ids, mask, global_ids = train_step.upload(batch)
        mark("host-to-device copy")
        view1, view2 = train_step.forward(model, ids, mask)
        mark("forward")
        loss, loss_to_backward = train_step.loss(view1, view2, global_ids, sizes)
        mark("loss (gather: none at 1 worker)")
        # The rest of SimCSEWorker.train_batch: its optimizer step, stage by stage.
        optimizer_step.backward(loss_to_backward)
        mark("backward")
        optimizer_step.clip()
        mark("clip grad norm")
        optimizer_step.step()
        mark("optimizer (fused AdamW)")
        # The train loop reads the loss every step (for logging), which syncs: so do we.
        value = float(loss.detach())
        mark("loss read")
        return value

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    guard.run(lambda: step(0))
    for i in range(1, args.warmup):
        step(i)
    sync(device)
    warmup_s = time.perf_counter() - started
    first_loss = step(args.warmup)  # untimed: the loss before the timed steps, for the sanity check
    sync(device)
    started = time.perf_counter()
    loss = first_loss
    for i in range(args.steps):
        loss = step(args.warmup + 1 + i)
    sync(device)
    elapsed = time.perf_counter() - started

    tokens = 2 * args.batch * args.seq_len * args.steps
    result: dict[str, Any] = {
        "warmup_s": warmup_s,
        "step_ms": 1000 * elapsed / args.steps,
        "sentences_per_s": args.batch * args.steps / elapsed,
        "tokens_per_s": tokens / elapsed,
        "loss_first": first_loss,
        "loss_last": loss,
        "compile": guard.state,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / GIB if cuda else None,
    }
    if args.phases:
        # Separate steps, synchronising at every phase boundary so that queued GPU work is
        # charged to the phase that queued it; that costs the overlap, so they are slower.
        phases = PhaseTimer(device)
        for i in range(args.phases + 2):
            if i == 2:  # the first phased steps allocate their pinned buffers: not counted
                phases.totals.clear()
            step(args.warmup + 1 + args.steps + i, phases)
        result["phase_ms"] = {name: 1000 * total / args.phases for name, total in phases.totals.items()}
    model.zero_grad(set_to_none=True)
    return result


class PhaseTimer:
    """Wall time per phase of a step, summed over steps; the device is synchronised at each
    mark, so asynchronous CUDA work lands in the phase that queued it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals: dict[str, float] = {}
        self.last = 0.0

    def start(self) -> None:
        sync(self.device)
        self.last = time.perf_counter()

    def mark(self, name: str) -> None:
        sync(self.device)
        now = time.perf_counter()
        self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now


def random_corpus(rows: int, min_len: int, max_len: int, seed: int = 0) -> TokenizedCorpus:
    """A ``TokenizedCorpus`` of ``rows`` random sentences of ``min_len`` to ``max_len`` word
    tokens (ids ``FIRST_WORD_ID`` and up), padded with id 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(FIRST_WORD_ID, VOCAB_SIZE, size=int(offsets[-1]))
    tokens = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))
    return TokenizedCorpus(pa.table({"id": np.arange(rows), "input_ids": tokens}), pad_token_id=0)


def bench_encode(
    model: SentenceEncoder, guard: CompileGuard, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    corpus = random_corpus(args.encode_rows, min(8, args.seq_len), args.seq_len)

    def encode(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return encode_rows(model, corpus, rows, batch_size=args.encode_batch, device=device)

    # Warm-up on a random sample, so it meets every batch width the timed pass will.
    sample = np.random.default_rng(1).choice(
        args.encode_rows, size=min(args.encode_rows, 4 * args.encode_batch), replace=False
    )
    started = time.perf_counter()
    guard.run(lambda: encode(sample))
    sync(device)
    warmup_s = time.perf_counter() - started
    started = time.perf_counter()
    embeddings = encode(np.arange(args.encode_rows))
    sync(device)
    elapsed = time.perf_counter() - started
    assert embeddings.shape == (args.encode_rows, model.encoder.config.hidden_size)
    return {
        "warmup_s": warmup_s,
        "compile": guard.state,
        "seconds": elapsed,
        "sentences_per_s": args.encode_rows / elapsed,
        "tokens_per_s": float(corpus.lengths.sum()) / elapsed,
    }


def random_unit_vectors(rows: int, dim: int, device: torch.device) -> np.ndarray:
    # Drawn on the device in blocks: a million 768-d rows are seconds of numpy on a CPU.
    out = np.empty((rows, dim), dtype=np.float32)
    generator = torch.Generator(device=device).manual_seed(2)
    block = 65536
    for lo in range(0, rows, block):
        n = min(block, rows - lo)
        v = torch.randn(n, dim, generator=generator, device=device)
        out[lo : lo + n] = F.normalize(v, dim=1).cpu().numpy()
    return out


@dataclass
class KnnTiming:
    scores: np.ndarray
    indices: np.ndarray
    backend: str
    index_seconds: float
    search_seconds: float


def search(
    vectors: np.ndarray, queries: np.ndarray, args: argparse.Namespace, device: torch.device
) -> KnnTiming:
    k = min(args.k, len(vectors))
    try:
        index = vector_index(
            vectors, kind=args.knn_index, use_gpu=device.type == "cuda", query_chunk=args.knn_query_chunk, k=k
        )
        started = time.perf_counter()
        scores, indices = index.search(queries, k)
        return KnnTiming(scores, indices, index.backend, index.build_seconds, time.perf_counter() - started)
    except ImportError:
        pass
    # No faiss here: the exact search the index module runs when its faiss lacks GPU support.
    started = time.perf_counter()
    base = torch.from_numpy(vectors).to(device)
    sync(device)
    built = time.perf_counter()
    scores, indices = torch_top_k(base, queries, k, args.knn_query_chunk)
    done = time.perf_counter()
    return KnnTiming(scores, indices, f"torch-{device.type}/flat (no faiss)", built - started, done - built)


def bench_knn(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    started = time.perf_counter()
    vectors = random_unit_vectors(args.knn_rows, args.dim, device)
    queries = vectors[: args.knn_queries].copy()
    generate_s = time.perf_counter() - started
    # Warm-up: GPU resources, cuBLAS handles and top-k kernels start on first use.
    search(vectors, queries[: min(256, len(queries))], args, device)
    sync(device)
    result = search(vectors, queries, args, device)
    found_self = float(np.mean(result.indices[:, 0] == np.arange(len(queries))))
    return {
        "backend": result.backend,
        "generate_s": generate_s,
        "index_s": result.index_seconds,
        "search_s": result.search_seconds,
        "queries_per_s": len(queries) / result.search_seconds,
        "self_found_first": found_self,
    }


def machine_info(device: torch.device) -> dict[str, Any]:
    info = report_machine_info(("transformers",))
    info["torch"] = torch.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["device"] = props.name
        info["device_memory_gib"] = round(props.total_memory / GIB, 1)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = (
            f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
    return info


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def render(
    args: argparse.Namespace, info: dict[str, Any], model_info: dict[str, Any], results: dict[str, Any]
) -> tuple[str, str]:
    """``(header, table)`` in markdown."""
    dtype = "bf16 autocast, TF32 matmuls" if args.device_type == "cuda" else "fp32"
    cuda = f", CUDA {info['cuda']}" if info.get("cuda") else ""
    peak = "n/a" if model_info["peak_tflops"] is None else f"{model_info['peak_tflops']:g}"
    header = (
        f"Device: {info['device']}; torch {info['torch']}{cuda}; {dtype}; "
        f"{args.size} BERT ({model_info['hidden']} hidden, {model_info['layers']} layers, "
        f"{model_info['non_embedding_params'] / 1e6:.1f}M non-embedding params, {model_info['attention']} attention); "
        f"train batch {args.batch} x 2 views x {args.seq_len} tokens; encode {args.encode_rows:,} rows "
        f"in batches of {args.encode_batch}; k-NN {args.knn_queries:,} queries over {args.knn_rows:,} x "
        f"{args.dim} vectors, k={args.k}; peak {peak} TFLOP/s."
    )
    t, e, n = results["train"], results["encode"], results["knn"]
    rows = [
        ("train: sentences/s", fmt(t["sentences_per_s"])),
        ("train: tokens/s (both views)", fmt(t["tokens_per_s"], 0)),
        ("train: step ms", fmt(t["step_ms"], 2)),
        ("train: MFU", "n/a" if t["mfu"] is None else f"{100 * t['mfu']:.1f}%"),
        ("torch.compile (train / encode)", f"{t['compile']} / {e['compile']}"),
        ("train: warm-up s", fmt(t["warmup_s"])),
        ("train: peak GPU memory GiB", fmt(t["peak_memory_gib"], 2)),
        ("train: loss first -> last timed step", f"{t['loss_first']:.4f} -> {t['loss_last']:.4f}"),
        ("encode: sentences/s", fmt(e["sentences_per_s"])),
        ("encode: tokens/s (no padding)", fmt(e["tokens_per_s"], 0)),
        ("encode: seconds", fmt(e["seconds"], 2)),
        ("encode: warm-up s", fmt(e["warmup_s"])),
        ("kNN: backend", n["backend"]),
        ("kNN: matmul precision", "TF32" if args.knn_tf32 else "fp32"),
        ("kNN: queries/s", fmt(n["queries_per_s"])),
        ("kNN: search s", fmt(n["search_s"], 3)),
        ("kNN: index build / upload s", fmt(n["index_s"], 3)),
        ("kNN: queries finding themselves first", f"{100 * n['self_found_first']:.1f}%"),
    ]
    phase_ms = t.get("phase_ms") or {}
    total = sum(phase_ms.values())
    rows += [
        (f"train phase ms: {name}", f"{ms:.2f} ({100 * ms / total:.0f}%)") for name, ms in phase_ms.items()
    ]
    table = "\n".join(["| metric | value |", "|---|---|", *(f"| {m} | {v} |" for m, v in rows)])
    return header, table


def append_markdown(
    path: Path, args: argparse.Namespace, info: dict[str, Any], header: str, table: str
) -> None:
    title = f"{args.size} BERT on {args.device_type}"
    body = f"{header}\n\n{table}"
    BENCHMARK.append(title, machine_line(info), body, path)


def parse_args() -> argparse.Namespace:
    parser = BENCHMARK.parser(__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument(
        "--batch", type=int, default=64, help="sentences per step (rows through the encoder: 2x)"
    )
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps (default 10 on CUDA, 2 on CPU)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 50 on CUDA, 10 on CPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the encoder")
    parser.add_argument(
        "--phases", type=int, default=0, metavar="N",
        help="also time N steps phase by phase (collate, copy, forward, loss, backward, clip, optimizer)",
    )  # fmt: skip
    parser.add_argument("--encode-rows", type=int, default=None, help="default 100k on CUDA, 2k on CPU")
    parser.add_argument("--encode-batch", type=int, default=512)
    parser.add_argument("--knn-rows", type=int, default=None, help="default 1M on CUDA, 20k on CPU")
    parser.add_argument("--knn-queries", type=int, default=None, help="default 10k on CUDA, 1k on CPU")
    parser.add_argument("--knn-index", choices=["flat", "ivf", "ivfpq", "auto"], default="flat")
    parser.add_argument(
        "--knn-query-chunk", type=int, default=8192, help="queries per matrix product (pipeline default)"
    )
    parser.add_argument(
        "--knn-tf32", action="store_true", help="TF32 k-NN products (the pipeline's run in fp32)"
    )
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="for MFU (default: H100/H200 bf16 dense)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON")
    args = parser.parse_args()
    args.device_type = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")).type
    cuda = args.device_type == "cuda"
    for name, on_cuda, on_cpu in (
        ("warmup", 10, 2),
        ("steps", 50, 10),
        ("encode_rows", 100_000, 2_000),
        ("knn_rows", 1_000_000, 20_000),
        ("knn_queries", 10_000, 1_000),
    ):
        if getattr(args, name) is None:
            setattr(args, name, on_cuda if cuda else on_cpu)
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    if args.knn_queries > args.knn_rows:
        parser.error("--knn-queries must not exceed --knn-rows (the queries are the first rows)")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device or args.device_type)
    torch.manual_seed(0)
    enable_tf32(device)  # as the train workers do
    info = machine_info(device)
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        peak = datasheet_peak_tflops(info["device"])

    model = build_model(args.size, args.seq_len).to(device)
    config = model.encoder.config
    model_info = {
        "hidden": config.hidden_size,
        "layers": config.num_hidden_layers,
        "non_embedding_params": EncoderFlops.of(model).non_embedding_params,
        "attention": getattr(config, "_attn_implementation", None) or "default",
        "peak_tflops": peak,
    }
    guard = CompileGuard(model, args.compile)
    print(f"device {info['device']}, torch {info['torch']}, {args.size} BERT", flush=True)

    print("train step ...", flush=True)
    train = bench_train(model, guard, args, device)
    flops_per_s = EncoderFlops.of(model).training_flops(train["tokens_per_s"], args.seq_len)
    train["mfu"] = flops_per_s / (peak * 1e12) if peak else None
    print("encode ...", flush=True)
    encode = bench_encode(model, guard, args, device)
    del model, guard
    if args.compile:
        torch._dynamo.reset()  # its caches hold the compiled encoder's weights
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the k-NN's similarity chunks want the memory
    print("k-NN ...", flush=True)
    # Only the train workers enable TF32; the miner's k-NN products run in full fp32.
    torch.set_float32_matmul_precision("high" if args.knn_tf32 else "highest")
    knn = bench_knn(args, device)
    results = {"train": train, "encode": encode, "knn": knn}

    header, table = render(args, info, model_info, results)
    print(f"\n{header}\n\n{table}")
    if args.append is not None:
        append_markdown(args.append, args, info, header, table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "date": str(date.today()),
            "command": command_line(BENCHMARK.module),
            "machine": info,
            "model": {"size": args.size, **model_info},
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": results,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
