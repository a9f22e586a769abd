"""Shared command-line handling for the thin ``jobs/*.py`` entry points.

Every job: ``--config FILE``, repeatable ``--set key=value``, ``--debug``. Errors end with
one line on stderr (``error: ...``) and a non-zero exit; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.config.loading import load_config
from pipeline.config.schema import Config
from pipeline.core.errors import ConfigError, describe_error

EXIT_CONFIG = 2
EXIT_FAILED = 1
CONFIG_DIR = Path(__file__).resolve().parents[2] / "jobs" / "configs"
"""The job configs shipped with the project."""


def display_path(path: Path) -> str:
    """``path`` as a user types it here: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def config_summary(path: Path) -> str:
    """A config file's one-line description: its first comment line, cut back to the end of
    its last whole clause (a top-level comma, or an unclosed parenthesis) when the sentence
    goes on in the next line."""
    comments = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        comments.append(line.lstrip("#").strip())
    first = comments[0] if comments else ""
    if len(comments) < 2 or first.endswith((".", ":")):
        return first.rstrip(".:")
    depth, cut, opened = 0, len(first), 0
    for i, char in enumerate(first):
        if char == "(":
            opened = i if depth == 0 else opened
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            cut = i
    return first[: opened if depth else cut].rstrip(" ,;:")


def shipped_configs_text(directory: Path = CONFIG_DIR) -> str:
    """One line per shipped config: its path (as :func:`display_path` writes it) and summary."""
    rows = [(display_path(path), config_summary(path)) for path in sorted(directory.glob("*.yaml"))]
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"  {name:<{width}}  {summary}" for name, summary in rows)


def job_main(
    doc: str | None,
    argv: list[str] | None,
    body: Callable[[Config, Callable[[str], None], argparse.Namespace], None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    to_overrides: Callable[[argparse.Namespace], list[str]] | None = None,
    *,
    set_example: str = "train.epochs=3",
    needs_config: bool = False,
) -> int:
    """Parse the common arguments (plus ``add_arguments``), load the config with the
    overrides ``to_overrides`` derives from job-specific flags and then the ``--set`` ones,
    run ``body``, and turn failures into one line and an exit code.

    ``doc`` (the job's docstring) is the ``--help`` text; ``set_example`` the ``--set``
    example there. With ``needs_config`` the help lists the shipped configs, and a call with
    neither ``--config`` nor ``--set`` prints the usage and that list and exits with 2 instead
    of running on the defaults."""
    configs = shipped_configs_text() if needs_config else ""  # empty without the repository's jobs/
    parser = argparse.ArgumentParser(
        description=(doc or "").strip() or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"shipped configs:\n{configs}" if configs else None,
    )
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument(
        "--config", metavar="FILE", help="YAML config file (defaults are used for anything it omits)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override one config value, e.g. --set {set_example} (repeatable; every key is in "
        "docs/configuration.md)",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    args = parser.parse_args(argv)
    if needs_config and args.config is None and not args.overrides:
        parser.print_usage(sys.stderr)
        message = f"{parser.prog}: no config given. Pass --config FILE"
        if configs:
            demo = display_path(CONFIG_DIR / "demo.yaml")
            message += f", e.g. one of the shipped configs:\n{configs}\n--config {demo} runs the demo"
        print(f"{message}; --help shows more examples.", file=sys.stderr)
        return EXIT_CONFIG
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    def echo(line: str) -> None:
        print(line, flush=True)

    try:
        extra = to_overrides(args) if to_overrides is not None else []
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

        code = EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return code
    return 0
