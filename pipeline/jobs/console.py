"""``raysimcse``: the console script (``raysimcse train|mine|evaluate ...``, ``raysimcse
--version``). Each job takes the same flags as ``python jobs/<job>.py``, which stays for
``ray job submit --working-dir``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

JOBS = {
    "train": "train a sentence encoder with SimCSE on Ray (jobs/train.py)",
    "mine": "mine hard negatives for a corpus or pairs with a trained encoder (jobs/mine.py)",
    "evaluate": "score an encoder on STS files and retrieval sets (jobs/evaluate.py)",
}


def installed_version() -> str:
    """The installed ``raysimcse`` distribution's version (``unknown`` when run from a
    checkout that was not installed)."""
    try:
        return version("raysimcse")
    except PackageNotFoundError:
        return "unknown"


def usage() -> str:
    """The one-screen help: the jobs and where each one's flags are."""
    width = max(map(len, JOBS))
    lines = [f"usage: raysimcse {{{','.join(JOBS)}}} [flags]   (raysimcse <job> --help for its flags)", ""]
    lines += [f"  {name:<{width}}  {text}" for name, text in JOBS.items()]
    lines += ["", "  --version  print the version and exit"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``raysimcse``; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"raysimcse {installed_version()}")
        return 0
    if args[0] not in JOBS:
        print(f"error: unknown job {args[0]!r}; one of: {', '.join(JOBS)}", file=sys.stderr)
        return 2
    job_main: Callable[[list[str]], int] = import_module(f"pipeline.jobs.{args[0]}").main
    # argparse names the program after argv[0] in usage lines and errors, and the MLflow run's
    # source tag reads it too: "raysimcse train", not "raysimcse".
    sys.argv[0] = f"raysimcse {args[0]}"
    return job_main(args[1:])
