"""Mine hard negatives for a dataset with a given model, offline.

    python jobs/mine.py --model DIR_OR_NAME --input FILE --output FILE.parquet|.jsonl \\
        [--config FILE] [--set mining.num_negatives=3 ...] [--debug]

Input: a text file (one sentence per line; each is its own positive) or pairs in
csv/tsv/jsonl/parquet (columns data.anchor_column / data.positive_column, default
anchor / positive). Output columns: anchor, positive, negative_1 ... negative_n.
The mining.* keys (docs/configuration.md) set how many negatives and which candidates count.
Each job is an MLflow run in experiment simcse-mining: counts, a similarity histogram and a
sample of the output; the summary ends with the run id (docs/mlflow.md).
"""

from __future__ import annotations

import sys

from pipeline.core.errors import DataError
from pipeline.data.formats import infer_format
from pipeline.runtime.cli import job_main


def _arguments(parser):
    parser.add_argument(
        "--model", required=True, metavar="DIR_OR_NAME", help="model folder or hub name (model.name_or_path)"
    )
    parser.add_argument("--input", required=True, metavar="FILE", help="text file or pairs file (data.path)")
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="where to write the triplets (.parquet or .jsonl)"
    )


def _task_of(path: str) -> str:
    """A text file holds sentences, each its own positive: the corpus task's mining, whose
    nearest rows are skipped as likely paraphrases (``mining.range_min``). Any other input
    holds (anchor, positive) pairs: the pairs task's."""
    try:
        return "corpus" if infer_format(path, "auto") == "text" else "pairs"
    except DataError:  # no telling extension: the reader says what to set
        return "pairs"


def _overrides(args) -> list[str]:
    return [
        f"task={_task_of(args.input)}",
        f"model.name_or_path={args.model}",
        f"data.path={args.input}",
        "tracking.experiment=simcse-mining",
    ]


def main(argv: list[str] | None = None) -> int:
    def body(cfg, echo, args):
        # Deferred: --help and a bad flag answer before Ray, torch and MLflow are imported.
        from pipeline.jobs.mine_job import run_mine_job

        echo(run_mine_job(cfg, args.output, echo=echo, debug=args.debug).render(args.output))

    return job_main(
        __doc__,
        argv,
        body,
        add_arguments=_arguments,
        to_overrides=_overrides,
        set_example="mining.num_negatives=3",
    )


if __name__ == "__main__":
    sys.exit(main())
