"""How fast the refresh's cross-encoder teacher scores (anchor, candidate) pairs, side by side
with sentence-transformers' ``CrossEncoder.predict`` on the same pairs, model and device.

    python -m bench.teacher_scoring --cross-encoder DIR [--pairs FILE] [--rows 2000] \\
        [--max-seq-len 32] [--repeats 3] [--threads N] [--append docs/benchmarks.md]
    python -m bench.teacher_scoring --from-encoder /work/teacher/all-mpnet-base-v2 ...

The pairs are the first ``--rows`` rows of a headerless ``anchor<TAB>positive[<TAB>label]``
file (default: the Twitter URL train split), each anchor paired with the positive of another
row drawn at random (seed 0), as a mined negative would be. Ours is
:class:`~pipeline.model.teacher.Teacher` with its cache off, so every pair is computed; the
peer is ``CrossEncoder.predict`` at the same batch (:func:`~pipeline.model.encode.
encode_batch_size`: 1,024 on a GPU, 64 on a CPU) and the same pair length (twice
``--max-seq-len``), its raw logits, in bf16 on a GPU as ours is. ``--from-encoder DIR`` puts a one-label head (random, seeded)
on an encoder folder, for a teacher of a real model's size and tokenizer where no trained
cross-encoder is at hand: the speed is the model's, whatever its head says.

One table: seconds and pairs a second for each side, the ratio (> 1: ours is faster) and the
largest difference between the two sides' logits (the same model, so the same scores to
float error; bf16 on a GPU).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import DATA, Alternating, Benchmark, machine_report, read_pair_file

BENCHMARK = Benchmark(__spec__.name, "The teacher's pair scoring against sentence-transformers' CrossEncoder")
TWITTER_TRAIN = DATA / "twitter-url" / "train.tsv"


def read_pairs(path: Path, rows: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``rows`` anchors from ``path`` (:func:`~bench.common.read_pair_file`, rows of any label
    with both texts) and, for each, another row's second text."""
    pairs = [(anchor, text) for anchor, text, _ in read_pair_file(path) if anchor and text]
    anchors, positives = [anchor for anchor, _ in pairs], [text for _, text in pairs]
    if len(anchors) < 2:
        raise SystemExit(f"{path}: fewer than 2 (anchor, positive) rows")
    rng = np.random.default_rng(seed)
    picked = np.arange(rows) % len(anchors)
    others = (picked + rng.integers(1, len(anchors), size=rows)) % len(anchors)
    return [anchors[i] for i in picked], [positives[j] for j in others]


def with_one_label_head(encoder_dir: Path, out: Path) -> Path:
    """``encoder_dir``'s encoder under a seeded random one-label head, saved in ``out``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(encoder_dir, num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(encoder_dir).save_pretrained(out)
    return out


def benchmark(
    args: argparse.Namespace, model_dir: Path, anchors: list[str], candidates: list[str]
) -> dict[str, Any]:
    import torch
    from sentence_transformers import CrossEncoder

    from pipeline.model.teacher import Teacher, TeacherSettings

    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ours = Teacher(
        TeacherSettings(str(model_dir), kind="cross_encoder", max_seq_len=args.max_seq_len), device=device
    )
    ours.cache_bytes = 0  # every pair computed, as the peer computes it
    # On a GPU ours scores under bf16 autocast (as every encode there); the peer in bf16 too.
    dtype = {"model_kwargs": {"torch_dtype": torch.bfloat16}} if device.startswith("cuda") else {}
    peer = CrossEncoder(str(model_dir), device=device, max_length=ours.pair_max_len, **dtype)
    pairs = list(zip(anchors, candidates, strict=True))

    def score_ours() -> np.ndarray:
        return ours.score(anchors, candidates)

    def score_peer() -> np.ndarray:
        return np.asarray(
            peer.predict(
                pairs, batch_size=ours.batch_size, activation_fn=torch.nn.Identity(), show_progress_bar=False
            ),
            dtype=np.float32,
        )

    def timed(score: Any) -> tuple[float, np.ndarray]:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        scores = score()
        return time.perf_counter() - started, scores

    sides = {"ours": score_ours, "peer": score_peer}
    scores = {name: timed(score)[1] for name, score in sides.items()}  # the warm-ups
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(args.repeats):
        for name in Alternating.order(repeat, list(sides)):
            elapsed, scores[name] = timed(sides[name])
            seconds[name].append(elapsed)
    ours_s, peer_s = (statistics.median(seconds[name]) for name in ("ours", "peer"))
    return {
        "device": device,
        "batch": ours.batch_size,
        "pair_len": ours.pair_max_len,
        "ours_s": ours_s,
        "peer_s": peer_s,
        "ratio": peer_s / ours_s,
        "max_abs": float(np.max(np.abs(scores["ours"] - scores["peer"]))),
    }


def render(rows: int, result: dict[str, Any]) -> str:
    header = "| pairs | device | batch | pair tokens | ours s | ours pairs/s | CrossEncoder s | CrossEncoder pairs/s | ratio | max abs logit difference |"
    r = result
    line = (
        f"| {rows:,} | {r['device']} | {r['batch']} | {r['pair_len']} | {r['ours_s']:.2f} | {rows / r['ours_s']:,.0f} | "
        f"{r['peer_s']:.2f} | {rows / r['peer_s']:,.0f} | {r['ratio']:.2f} | {r['max_abs']:.1e} |"
    )
    return "\n".join([header, "|" + "---|" * header.count(" | ") + "---|", line])


def main(argv: list[str] | None = None) -> None:
    parser = BENCHMARK.parser(__doc__, whole_doc=True)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--cross-encoder", type=Path, help="a one-label cross-encoder folder")
    model.add_argument("--from-encoder", type=Path, help="an encoder folder, given a random one-label head")
    parser.add_argument(
        "--pairs", type=Path, default=TWITTER_TRAIN, help="headerless anchor<TAB>positive rows"
    )
    parser.add_argument("--rows", type=int, default=2000, help="pairs to score")
    parser.add_argument("--max-seq-len", type=int, default=32, help="tokens a text (a pair: twice that)")
    parser.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    Alternating.add_options(parser, repeats=3)
    args = BENCHMARK.parse(parser, argv)
    anchors, candidates = read_pairs(args.pairs, args.rows)
    from pipeline.model.folders import quiet_libraries

    quiet_libraries()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.cross_encoder or with_one_label_head(args.from_encoder, Path(scratch))
        result = benchmark(args, model_dir, anchors, candidates)
    table = render(args.rows, result)
    print(table + "\n\n" + Alternating.note(args.repeats))
    if args.append is not None:
        body = f"{Alternating.note(args.repeats)}\n\n{table}\n"
        BENCHMARK.append(
            "Cross-encoder pair scoring", machine_report("torch", "transformers", "sentence-transformers"), body,
            path=args.append, argv=argv,
        )  # fmt: skip


if __name__ == "__main__":
    main()
