"""Inputs for the peer comparisons on a machine with neither ../shared nor a model hub (the
lent GPU machine): generated sentences where the benches read the Wikipedia file, and a
random-weights BERT folder that both sides load.

    python -m bench.gpu_inputs --out /tmp/gpu-inputs [--config jobs/configs/gpu-one.yaml] [--rows 100000]

Writes ``OUT/wiki/wiki1m_for_simcse.first11914.txt`` (the path ``--data OUT`` points the
benches at; ``--rows`` distinct generated sentences, one a line) and ``OUT/initial_model``:
a WordPiece tokenizer trained on those sentences and a randomly initialised BERT-base, the
folder ``gpu-one.yaml`` names (seed, sequence length and dropout from ``--config``). Then, e.g.:

    python -m bench.train_throughput --data /tmp/gpu-inputs --model /tmp/gpu-inputs/initial_model \\
        --configs ours-1w st --steps 300 --set train.gpus_per_worker=1
    python -m bench.mining_vs_st --data /tmp/gpu-inputs --model /tmp/gpu-inputs/initial_model \\
        --workloads wiki --batch-size 1024

With ``--teacher-pairs N`` it writes instead what ``jobs/configs/gpu-teacher.yaml`` reads (the
pairs task with a teacher in the refresh, issue 71): ``OUT/pairs/train.tsv``, ``N`` headerless
(sentence, paraphrase, 1) rows cycling through each generated paraphrase group;
``OUT/student``, a random MiniLM-L6-size BERT (the recipe's student's shape); and
``OUT/teacher``, a random BERT-base one-label sequence classifier (a cross-encoder of the
recipe's teacher's size), each with a tokenizer trained on the rows' sentences.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bench.common import REPO, WIKI, argument_parser
from pipeline.config.data_section import GENERATED_GROUP_SIZE
from pipeline.config.loading import load_config
from pipeline.data.synthetic import generate_paraphrase_corpus
from pipeline.model.tiny import BertShape, build_random_bert_dir

BERT_BASE = BertShape(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, vocab_size=30522)
"""BERT-base's shape: the per-step compute of the model most SimCSE results are quoted for."""

MINILM_L6 = BertShape(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536, vocab_size=30522)
"""all-MiniLM-L6-v2's shape: the Twitter URL recipe's student."""


def write_inputs(out: Path, config: Path, rows: int, shape: BertShape = BERT_BASE) -> tuple[Path, Path]:
    """The sentence file and the model folder (a random BERT of ``shape``); returns their paths."""
    cfg = load_config(config)
    sentences, _ = generate_paraphrase_corpus(-(-rows // GENERATED_GROUP_SIZE), cfg.run.seed)
    distinct = list(dict.fromkeys(s.strip() for s in sentences if s.strip()))[:rows]
    text_file = out / WIKI
    text_file.parent.mkdir(parents=True, exist_ok=True)
    text_file.write_text("\n".join(distinct) + "\n", encoding="utf-8")
    model_dir = build_random_bert_dir(
        distinct,
        out / "initial_model",
        max_seq_len=cfg.data.max_seq_len,
        dropout=cfg.model.dropout,
        seed=cfg.run.seed,
        shape=shape,
    )
    return text_file, model_dir


def write_teacher_inputs(out: Path, config: Path, pairs: int) -> tuple[Path, Path, Path]:
    """The pairs file, the student's folder and the cross-encoder teacher's; returns their paths."""
    from transformers import BertForSequenceClassification

    cfg = load_config(config)
    sentences, group = generate_paraphrase_corpus(-(-pairs // GENERATED_GROUP_SIZE), cfg.run.seed)
    rows = []
    # Each group's sentences in order, then (s0, s1), (s1, s2), ... (s_last, s0): every sentence
    # is an anchor once and a positive once.
    order = np.argsort(group, kind="stable")
    by_group = np.split(order, np.flatnonzero(np.diff(group[order])) + 1)
    for members in by_group:
        texts = [sentences[i] for i in members]
        rows += [f"{a}\t{b}\t1" for a, b in zip(texts, texts[1:] + texts[:1], strict=True)]
    pairs_file = out / "pairs" / "train.tsv"
    pairs_file.parent.mkdir(parents=True, exist_ok=True)
    pairs_file.write_text("\n".join(rows[:pairs]) + "\n", encoding="utf-8")
    student = build_random_bert_dir(
        sentences, out / "student", max_seq_len=cfg.data.max_seq_len, dropout=cfg.model.dropout,
        seed=cfg.run.seed, shape=MINILM_L6,
    )  # fmt: skip
    teacher_dir = build_random_bert_dir(
        sentences, out / "teacher", max_seq_len=2 * cfg.data.max_seq_len, dropout=0.1,
        seed=cfg.run.seed + 1, shape=BERT_BASE,
    )  # fmt: skip
    # The random encoder under a one-label head: the folder a sentence-transformers CrossEncoder saves.
    BertForSequenceClassification.from_pretrained(teacher_dir, num_labels=1).save_pretrained(teacher_dir)
    return pairs_file, student, teacher_dir


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "jobs" / "configs" / "gpu-one.yaml")
    parser.add_argument("--rows", type=int, default=100_000, help="distinct sentences to write")
    parser.add_argument(
        "--teacher-pairs", type=int, help="write gpu-teacher.yaml's inputs instead: this many pair rows"
    )
    args = parser.parse_args(argv)
    if args.teacher_pairs:
        pairs_file, student, teacher = write_teacher_inputs(args.out, args.config, args.teacher_pairs)
        print(f"{args.teacher_pairs:,} pairs in {pairs_file}; student in {student}; teacher in {teacher}")
        return 0
    text_file, model_dir = write_inputs(args.out, args.config, args.rows)
    lines = sum(1 for _ in text_file.open(encoding="utf-8"))
    print(f"{lines:,} sentences in {text_file}; model in {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
