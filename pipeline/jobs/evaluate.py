"""Evaluate a sentence encoder on STS files (Spearman x 100 of cosine similarity) and on
retrieval sets (nDCG@10, MRR@10, Recall@1/@10/@100 x 100).

    python jobs/evaluate.py --model runs/demo/model --sts runs/demo/generated_sts.tsv
    python jobs/evaluate.py --model DIR --sts sts-dev.csv --sts cnsd-sts-dev.txt --json
    python jobs/evaluate.py --model DIR --sts sts-dev.csv --whiten-on corpus.txt --whitening-dim 256
    python jobs/evaluate.py --model DIR --retrieval beir-folder --retrieval pairs.tsv --json

Reads the STS-B release (tab-separated), CNSD (id||s1||s2||score) and csv/tsv/jsonl with
sentence1, sentence2, score columns, each told apart by name and first line. A pair is a
positive (alignment, paraphrase retrieval) from 0.8 x its file's gold scale (4 on 0-5).
Retrieval sets are BEIR folders (queries.jsonl, corpus.jsonl, qrels/dev.tsv; FOLDER#SPLIT for
another qrels split) or pair files
(sentence1, sentence2, label 0/1: a headerless, unquoted .tsv, or .csv/.jsonl/.parquet).
Prints a table per kind, or with --json one JSON object: spearman and pairs (the average and
the total for several STS files) and files, and retrieval with one entry per set.
--whiten-on fits BERT-whitening post hoc and scores STS with and without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pipeline.core.errors import describe_error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", required=True, metavar="DIR", help="model folder (a pipeline export or any HF/ST folder)"
    )
    parser.add_argument("--sts", action="append", default=[], metavar="FILE", help="STS file (repeatable)")
    parser.add_argument(
        "--retrieval",
        action="append",
        default=[],
        metavar="PATH",
        help="retrieval set: a BEIR folder (FOLDER#SPLIT picks the qrels) or a pair file (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="N",
        help="sentences per batch (default: 64 on a CPU, 1024 on a GPU)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        metavar="N",
        help="tokens per sentence (default: the model folder's own)",
    )
    parser.add_argument(
        "--whiten-on", metavar="CORPUS", help="fit BERT-whitening on this text file's sentences"
    )
    parser.add_argument(
        "--whitening-dim", type=int, default=None, metavar="K", help="keep the first K whitened dimensions"
    )
    parser.add_argument(
        "--whitening-rows",
        type=int,
        default=10_000,
        metavar="N",
        help="sentences of --whiten-on to fit on (default: 10000)",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = parser.parse_args(argv)
    if not args.sts and not args.retrieval:
        parser.error("give at least one --sts FILE or --retrieval PATH")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        # Deferred: --help and a bad flag answer before torch and transformers are imported.
        from pipeline.evaluation.retrieval_scoring import (
            evaluate_retrieval_model_dir,
            format_retrieval_table,
        )
        from pipeline.evaluation.retrieval_sets import read_retrieval_sets
        from pipeline.evaluation.scoring import (
            evaluate_model_dir,
            format_table,
            read_sentences,
            score_summary,
        )
        from pipeline.model.folders import quiet_libraries

        quiet_libraries()
        if not os.path.isdir(args.model):
            raise FileNotFoundError(f"--model: no model folder at {args.model}")
        retrieval_sets = read_retrieval_sets(args.retrieval)  # a bad set fails before any encoding
        scores = []
        if args.sts:
            scores = evaluate_model_dir(
                args.model,
                args.sts,
                batch_size=args.batch_size,
                max_seq_len=args.max_seq_len,
                whitening_texts=read_sentences(args.whiten_on, args.whitening_rows)
                if args.whiten_on
                else None,
                whitening_dim=args.whitening_dim,
            )
        retrieval = (
            evaluate_retrieval_model_dir(args.model, retrieval_sets, args.batch_size, args.max_seq_len)
            if retrieval_sets
            else []
        )
    except Exception as exc:
        if args.debug:
            raise

        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 1
    if args.json:
        summary = score_summary(scores) if scores else {}
        if retrieval:
            summary["retrieval"] = [score.as_dict() for score in retrieval]
        print(json.dumps(summary))
        return 0
    tables = []
    if scores:
        tables.append(
            format_table(
                scores, title=f"STS evaluation of {args.model} (Spearman x 100 of cosine similarity)"
            )
        )
    if retrieval:
        tables.append(
            format_retrieval_table(
                retrieval, title=f"Retrieval evaluation of {args.model} (x 100, cosine similarity)"
            )
        )
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
