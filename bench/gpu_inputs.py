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
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import REPO, WIKI, argument_parser
from pipeline.config.data_section import GENERATED_GROUP_SIZE
from pipeline.config.loading import load_config
from pipeline.data.synthetic import generate_paraphrase_corpus
from pipeline.model.tiny import BertShape, build_random_bert_dir

BERT_BASE = BertShape(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, vocab_size=30522)
"""BERT-base's shape: the per-step compute of the model most SimCSE results are quoted for."""


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


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__spec__.name, __doc__, whole_doc=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "jobs" / "configs" / "gpu-one.yaml")
    parser.add_argument("--rows", type=int, default=100_000, help="distinct sentences to write")
    args = parser.parse_args(argv)
    text_file, model_dir = write_inputs(args.out, args.config, args.rows)
    lines = sum(1 for _ in text_file.open(encoding="utf-8"))
    print(f"{lines:,} sentences in {text_file}; model in {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
