"""One hard-negative refresh at scale: time and peak memory per stage, tiny model on CPU.

    python -m bench.mining_refresh --rows 100000 --rows 1000000 [--index flat --index ivf] \
        [--model DIR] [--encode-batch-size 1024]

Generates a corpus of paraphrase groups, tokenizes it, builds the tiny BERT the demo uses
(or loads ``--model DIR``, e.g. all-MiniLM-L6-v2's folder, for a real model's costs),
and runs the miner's stages (encode, then search + filters + plan: ``refresh_corpus``) exactly
as a refresh does, measuring each. Prints one table and appends it with machine info to
docs/benchmarks.md (``--no-record`` to skip). Peak memory is the process's RSS high-water
mark sampled every 50 ms during the stage.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import GIB, Benchmark, PeakRss, machine_report
from bench.embedded_texts import EmbeddedTexts
from pipeline.config.data_section import GENERATED_GROUP_SIZE
from pipeline.data.normalize import normalized_id
from pipeline.data.synthetic import generate_paraphrase_corpus
from pipeline.data.tokenize import tokenize_table
from pipeline.data.tokenized import TokenizedCorpus
from pipeline.data.utf8 import stable_row_id
from pipeline.mining.hard_negatives import SearchSettings
from pipeline.mining.index import IndexSpec
from pipeline.mining.miner_settings import MinerSettings
from pipeline.mining.planning import refresh_corpus
from pipeline.mining.text_keys import dense_keys
from pipeline.model.encode import encode_rows
from pipeline.model.encoder import load_sentence_encoder
from pipeline.model.folders import load_tokenizer
from pipeline.model.tiny import build_random_bert_dir

BENCHMARK = Benchmark(__spec__.name, "Mining refresh at scale")


def stage(name: str, results: dict, fn):
    with PeakRss() as rss:
        start = time.perf_counter()
        value = fn()
        results[name] = (time.perf_counter() - start, rss.peak)
    print(f"  {name:<18} {results[name][0]:8.1f}s  peak RSS {rss.peak / GIB:5.2f} GiB", flush=True)
    return value


def run(
    rows: int, *, index_kind: str, batch_size: int, top_k: int, model_dir: Path, encode_batch: int
) -> dict:
    import pyarrow as pa
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    results: dict = {}
    print(f"rows={rows} index={index_kind}", flush=True)
    texts = stage(
        "generate", results, lambda: generate_paraphrase_corpus(rows // GENERATED_GROUP_SIZE, seed=1)[0]
    )
    tokenizer = load_tokenizer(model_dir)

    def tokenize():
        # In blocks, as the pipeline's Ray Data stage does: one call over a million texts
        # would hold every token list as Python objects at once.
        ids = np.array([stable_row_id(t) for t in texts], dtype=np.int64)
        table = pa.table({"id": ids, "text": texts})
        blocks = [tokenize_table(table.slice(i, 20_000), tokenizer, 32) for i in range(0, rows, 20_000)]
        return TokenizedCorpus(pa.concat_tables(blocks), tokenizer.pad_token_id)

    corpus = stage("tokenize", results, tokenize)
    model = load_sentence_encoder(model_dir, pooler="mean")
    embeddings = stage(
        "encode",
        results,
        lambda: encode_rows(
            model, corpus, np.arange(rows), batch_size=encode_batch, device=torch.device("cpu")
        ),
    )
    keys = dense_keys(np.array([normalized_id(t) for t in texts]))  # as the miner keys them
    settings = MinerSettings(
        pooler="mean", batch_size=batch_size, seed=0,
        search=SearchSettings(top_k=top_k, index=IndexSpec(kind=index_kind)),
        batch_sampler="knn",  # the sampler docs/benchmarks.md measured
    )  # fmt: skip
    # The refresh after its encode, as the miner runs it: search, filter, plan, measure.
    report = stage(
        "search+plan", results,
        lambda: refresh_corpus(
            EmbeddedTexts(embeddings, None, settings.search, seed=settings.seed + 1, keys=keys),
            settings=settings, version=1, previous_version=None,
        ),
    )  # fmt: skip
    results["index_s"], results["search_s"] = (
        report.metrics["mining/index_s"],
        report.metrics["mining/search_s"],
    )
    results["plan_s"] = report.metrics["mining/plan_s"]
    estimate = int(report.metrics["mining/index_estimated_mib"] * 2**20)
    results["estimate_bytes"] = estimate
    results["dim"] = embeddings.shape[1]
    return results


def main() -> None:
    parser = BENCHMARK.parser(__doc__, append=False)
    parser.add_argument("--rows", type=int, action="append", help="corpus sizes (repeatable)")
    parser.add_argument(
        "--index", action="append", choices=["flat", "ivf", "ivfpq"], help="index kinds (repeatable)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--encode-batch-size", type=int, default=1024)
    parser.add_argument("--model", type=Path, help="model folder (default: a tiny BERT built here)")
    parser.add_argument(
        "--no-record", action="store_true", help="print only; do not append to docs/benchmarks.md"
    )
    args = parser.parse_args()
    sizes = args.rows or [100_000]
    kinds = args.index or ["flat"]

    with tempfile.TemporaryDirectory() as tmp:
        sample, _ = generate_paraphrase_corpus(2000, seed=1)
        model_dir = args.model or build_random_bert_dir(
            sample, Path(tmp) / "tiny", max_seq_len=32, dropout=0.1, seed=0
        )
        rows_out = []
        for rows in sizes:
            for kind in kinds:
                r = run(
                    rows,
                    index_kind=kind,
                    batch_size=args.batch_size,
                    top_k=args.top_k,
                    model_dir=model_dir,
                    encode_batch=args.encode_batch_size,
                )
                rows_out.append((rows, kind, r))

    header = (
        "| rows | index | tokenize s | encode s | index s | search s | filter+plan s | refresh s "
        "| prep peak RSS GiB | refresh peak RSS GiB | index estimate GiB |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for rows, kind, r in rows_out:
        refresh_stages = ("encode", "search+plan")
        refresh = sum(r[name][0] for name in refresh_stages)
        prep_peak = max(r[name][1] for name in ("generate", "tokenize"))
        refresh_peak = max(r[name][1] for name in refresh_stages)
        lines.append(
            f"| {rows:,} | {kind} | {r['tokenize'][0]:.1f} | {r['encode'][0]:.1f} | {r['index_s']:.1f} | "
            f"{r['search_s']:.1f} | {r['plan_s']:.1f} | {refresh:.1f} | {prep_peak / GIB:.2f} | "
            f"{refresh_peak / GIB:.2f} | {r['estimate_bytes'] / GIB:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not args.no_record:
        model = (
            f"model {args.model.parent.name}/{args.model.name}"
            if args.model
            else "Tiny BERT (64 hidden, 2 layers)"
        )
        body = (
            f"{model}, top_k={args.top_k}, plan batch {args.batch_size}, encode batch "
            f"{args.encode_batch_size}, default filters.\n\n{table}"
        )
        title = (
            f"{'A real' if args.model else 'Tiny'} model on CPU, {', '.join(f'{n:,}' for n in sizes)} rows"
        )
        BENCHMARK.append(title, machine_report(), body)


if __name__ == "__main__":
    main()
