"""Shared command-line handling for the thin ``jobs/*.py`` entry points.

Every job: ``--config FILE``, repeatable ``--set key=value``, ``--debug``. Errors end with
one line on stderr (``error: ...``) and a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from pipeline.config import Config, ConfigError, load_config

EXIT_CONFIG = 2
EXIT_FAILED = 1


def job_main(
    doc: str | None,
    argv: list[str] | None,
    body: Callable[[Config, Callable[[str], None], argparse.Namespace], None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    to_overrides: Callable[[argparse.Namespace], list[str]] | None = None,
) -> int:
    """Parse the common arguments (plus ``add_arguments``), load the config with the
    overrides ``to_overrides`` derives from job-specific flags and then the ``--set`` ones,
    run ``body``, and turn failures into one line and an exit code."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("--config", help="YAML config file (defaults are used for anything it omits)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set train.epochs=3 (repeatable)",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    def echo(line: str) -> None:
        print(line, flush=True)

    try:
        extra = to_overrides(args) if to_overrides is not None else []
        if args.debug:
            extra.insert(0, "ray.train_log_level=INFO")  # Ray Train's tracebacks; --set still wins
        cfg = load_config(args.config, extra + args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        body(cfg, echo, args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        from pipeline.errors import describe_error

        code = EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return code
    return 0
