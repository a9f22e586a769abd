"""``python jobs/train.py``: the entry point that ``ray job submit --working-dir`` runs; the job
itself, its flags and its help are :mod:`pipeline.jobs.train` (also ``raysimcse train``)."""

import os
import sys

# Run as a script from a checkout or an uploaded working dir, where the package is not installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.jobs.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
