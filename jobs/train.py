"""Train a sentence encoder with SimCSE on Ray.

    python jobs/train.py --config jobs/configs/demo.yaml [--set train.epochs=3 ...] [--debug]

Runs locally (starting a local Ray) or unchanged under
``ray job submit --working-dir . -- python jobs/train.py --config ...``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.cli import job_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from pipeline.job import run_train_job

    return job_main(__doc__, argv, lambda cfg, echo, _args: echo(run_train_job(cfg, echo=echo).render()))


if __name__ == "__main__":
    sys.exit(main())
