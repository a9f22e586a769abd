"""Activation memory in pieces (``train.mini_batch_size``), side by side with
sentence-transformers' cached loss.

    python -m bench.mini_batch_memory                           # all-MiniLM-L6-v2, 64 rows x (2 + 7) texts
    python -m bench.mini_batch_memory --pieces 0,64,32 --steps 4 --append docs/benchmarks.md

One training step of the pairs task on a batch of ``--rows`` (anchor, positive, ``--negatives``
negatives) rows, every text ``--max-seq-len`` random tokens, so both sides get the same tokens
and the same padding (none):

- ours: :class:`~pipeline.training.triplet_step.TripletStep` on
  :class:`~pipeline.model.encoder.SentenceEncoder` (mean pooling, the model's dropout) with
  ``mini_batch_size`` each of ``--pieces`` (0: the whole batch in one pass), then
  :class:`~pipeline.training.step.OptimizerStep` (backward, clipping, AdamW);
- the peer: ``MultipleNegativesRankingLoss`` at 0 and ``CachedMultipleNegativesRankingLoss``
  at each other ``--pieces`` (its ``mini_batch_size``: GradCache), on the same model loaded as
  a ``SentenceTransformer``, its loss backpropagated and AdamW stepped.

Both run in fp32 (our CPU steps run bf16 where the CPU computes it natively; the peer's
script runs fp32 unless told otherwise): the comparison is of the mechanism, not the precision.
Each configuration runs in a process of its own, so its peak RSS is its own: the table gives
the peak above the process's RSS once the model and the batch are loaded (activations, the
gradients and AdamW's state), and the median step time after one untimed step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common import FIRST_WORD_ID, Benchmark, machine_report, model_label, status_bytes

BENCHMARK = Benchmark(__spec__.name, "Activation memory in pieces (train.mini_batch_size)")
LR = 5e-5


def _mib(field: str) -> float:
    """This process's ``VmRSS`` or ``VmHWM`` (its peak) in MiB."""
    return status_bytes(os.getpid(), field) / 2**20


def _tokens(rows: int, negatives: int, seq_len: int, vocab: int) -> np.ndarray:
    """``(rows, 2 + negatives, seq_len)`` token ids: each row's anchor, positive, negatives."""
    rng = np.random.default_rng(0)
    return rng.integers(FIRST_WORD_ID, vocab, size=(rows, 2 + negatives, seq_len))


def _ours(model_dir: Path, tokens: np.ndarray, pieces: int) -> Callable[[], float]:
    import pyarrow as pa

    from pipeline.data.tokenized import TokenizedCorpus
    from pipeline.data.triplets import Triplets
    from pipeline.model.accel import fused_adamw
    from pipeline.model.encoder import load_sentence_encoder
    from pipeline.training.global_batch import GlobalBatch
    from pipeline.training.step import OptimizerStep
    from pipeline.training.triplet_step import TripletStep

    rows, texts, _ = tokens.shape
    # Positions: anchors 0..rows-1, positives rows..2 rows-1, then each row's negatives.
    flat = np.concatenate([tokens[:, 0], tokens[:, 1], tokens[:, 2:].reshape(-1, tokens.shape[2])])
    corpus = TokenizedCorpus(pa.table({"input_ids": pa.array(flat.tolist(), pa.list_(pa.int32()))}), 0)
    triplets = Triplets(np.arange(rows), np.arange(rows, 2 * rows), np.full(rows, -1))
    mined = (2 * rows + np.arange(rows * (texts - 2))).reshape(rows, texts - 2)
    model = load_sentence_encoder(model_dir, pooler="mean").train()
    model.mini_batch_size = pieces
    step = TripletStep(corpus, triplets, 0.05, 0.0, torch.device("cpu"), bf16=False)
    optimizer = fused_adamw(model, LR, 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    optimizer_step = OptimizerStep(model, optimizer, scheduler, 1.0)
    batch = GlobalBatch(np.arange(rows), [rows], 0, mined=mined)

    def train_step() -> float:
        loss, to_backward = step(model, batch)
        optimizer_step(to_backward)
        return float(loss)

    return train_step


def _peer(model_dir: Path, tokens: np.ndarray, pieces: int) -> Callable[[], float]:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.train()
    loss_fn = (
        CachedMultipleNegativesRankingLoss(model, mini_batch_size=pieces)
        if pieces
        else MultipleNegativesRankingLoss(model)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    features = [
        {"input_ids": torch.from_numpy(tokens[:, c]), "attention_mask": torch.ones(tokens[:, c].shape, dtype=torch.long)}
        for c in range(tokens.shape[1])
    ]  # fmt: skip

    def train_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn([dict(f) for f in features], None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss)

    return train_step


def measure_one(side: str, model_dir: Path, tokens: np.ndarray, pieces: int, steps: int) -> dict:
    """One configuration in this process: its peak RSS above the loaded model and batch, and
    its median step seconds after an untimed first step."""
    torch.manual_seed(0)
    train_step = (_ours if side == "ours" else _peer)(model_dir, tokens, pieces)
    loaded = _mib("VmRSS")
    seconds, losses = [], []
    for _ in range(steps + 1):
        started = time.perf_counter()
        losses.append(train_step())
        seconds.append(time.perf_counter() - started)
    return {
        "side": side, "pieces": pieces, "loaded_mib": loaded, "peak_above_mib": _mib("VmHWM") - loaded,
        "step_s": float(np.median(seconds[1:])), "loss": losses[0],
    }  # fmt: skip


def report(results: list[dict], rows: int, texts: int) -> str:
    ours = {r["pieces"]: r for r in results if r["side"] == "ours"}
    peer = {r["pieces"]: r for r in results if r["side"] == "peer"}
    lines = [
        f"One step, {rows} rows x {texts} texts ({rows * texts} texts), fp32, both sides on the same tokens.",
        "",
        "| pieces (texts a pass) | ours: peak above load MiB | ours: step s | peer: peak above load MiB | "
        "peer: step s | memory ours/peer | time ours/peer | ours: memory / one pass | ours: time / one pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    whole = ours.get(0)
    for pieces in sorted(ours, key=lambda p: (p != 0, -p)):  # one pass first, then larger pieces
        o, p = ours[pieces], peer.get(pieces)
        name = "0 (one pass; peer: MNRL)" if pieces == 0 else f"{pieces} (peer: cached MNRL)"
        cells = [name, f"{o['peak_above_mib']:,.0f}", f"{o['step_s']:.2f}"]
        cells += [f"{p['peak_above_mib']:,.0f}", f"{p['step_s']:.2f}"] if p else ["", ""]
        cells += (
            [f"{o['peak_above_mib'] / p['peak_above_mib']:.2f}", f"{o['step_s'] / p['step_s']:.2f}"]
            if p
            else ["", ""]
        )
        cells += (
            [f"{o['peak_above_mib'] / whole['peak_above_mib']:.2f}", f"{o['step_s'] / whole['step_s']:.2f}"]
            if whole
            else ["", ""]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = BENCHMARK.parser(__doc__, side_by_side=True)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--negatives", type=int, default=7)
    parser.add_argument(
        "--pieces", default="0,64", help="comma-separated mini_batch_size values (0: one pass)"
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one untimed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = BENCHMARK.parse(parser, argv)
    if args.one:  # a child: one configuration, its numbers as the last line
        from transformers import AutoConfig

        if args.threads:
            torch.set_num_threads(args.threads)
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        tokens = _tokens(args.rows, args.negatives, args.max_seq_len, vocab)
        side, pieces = args.one.split(":")
        print(json.dumps(measure_one(side, args.model, tokens, int(pieces), args.steps)), flush=True)
        return 0
    results = []
    child = list(argv if argv is not None else sys.argv[1:])
    for pieces in [int(p) for p in args.pieces.split(",")]:
        for side in ("ours", "peer"):
            done = subprocess.run(
                [sys.executable, "-m", BENCHMARK.module, *child, "--one", f"{side}:{pieces}"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"error: {side} at pieces {pieces} failed: {done.stderr.strip().splitlines()[-1:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"[bench] {side} pieces {pieces}: {results[-1]}", flush=True)
    table = report(results, args.rows, 2 + args.negatives)
    print(table)
    if args.append:
        BENCHMARK.append(
            f"{model_label(args.model)}, {args.rows} rows x {2 + args.negatives} texts of {args.max_seq_len} tokens",
            machine_report("torch", "sentence-transformers"), table, args.append, argv,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
