"""Train a sentence encoder with SimCSE on Ray; the run is tracked in MLflow.

Common invocations (from the repository root):

  the demo: a generated corpus and a tiny BERT, no downloads (a few minutes on a CPU)
    python jobs/train.py --config jobs/configs/demo.yaml

  your corpus with a real pretrained encoder (all-MiniLM-L6-v2 unless you name another)
    python jobs/train.py --config jobs/configs/your-corpus.yaml \\
        --set data.path=corpus.parquet --set data.text_column=sentence \\
        --set model.name_or_path=sentence-transformers/all-MiniLM-L6-v2 --set run.name=my-run

  another run of a config, with changed values; the same run.name again resumes that run
  from its latest checkpoint (a finished run is not re-run)
    python jobs/train.py --config jobs/configs/demo.yaml --set run.name=demo-5 --set train.epochs=5

Runs locally (starting a local Ray) or unchanged under
ray job submit --working-dir . -- python jobs/train.py --config ...
"""

from __future__ import annotations

import sys

from pipeline.runtime.cli import job_main


def main(argv: list[str] | None = None) -> int:
    def body(cfg, echo, args):
        # Deferred: --help and a bad flag answer before Ray, torch and MLflow are imported.
        from pipeline.jobs.train_job import run_train_job

        echo(run_train_job(cfg, echo=echo, debug=args.debug).render())

    return job_main(__doc__, argv, body, needs_config=True)


if __name__ == "__main__":
    sys.exit(main())
