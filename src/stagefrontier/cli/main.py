"""The ``stagefrontier`` command's parser and entry point.

Subcommands register themselves in ``COMMANDS``: each entry is a function that adds its parser
to the subparsers and sets ``handler`` (``Namespace -> exit status``) as a default; each family
of subcommands is a module of this package. A new subcommand is one more such function.

Exit status: 0 on success, 1 when ``validate`` finds a failing check or ``compare``'s gate
fails, 2 on bad input or usage, 3 when the gate cannot judge the two runs.
Errors print one line to stderr, never a traceback. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from ..errors import StageFrontierError
from ..launch import command as run_command
from ..logs import shown_on_stderr
from ..render.escape import printable
from ..render.last_resort import last_resort_line
from .common import EXIT_ERROR, EXIT_OK, Handler, Subparsers
from .parsers import (
    add_analyze,
    add_capture,
    add_compare,
    add_demo,
    add_incident,
    add_plot,
    add_report,
    add_validate,
)

COMMANDS: list[Callable[[Subparsers], None]] = [
    add_analyze,
    add_validate,
    add_report,
    add_plot,
    add_compare,
    add_demo,
    add_incident,
    add_capture,
    run_command.add_parser,
]
"""Subcommand registrars, in help order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stagefrontier",
        description="Synchronization-aware stage accounting for distributed training.",
    )
    parser.add_argument("--version", action="version", version=f"stagefrontier {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(sub)
    return parser


def _mistyped_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """``unknown command 'reprot'; did you mean 'report'?`` when the first argument is meant as
    a command but is none, and one is close to it; None otherwise (argparse answers the rest)."""
    if not argv or argv[0].startswith("-"):
        return None
    commands = next(
        action.choices
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    if argv[0] in commands:
        return None
    close = difflib.get_close_matches(argv[0], list(commands), n=1, cutoff=0.6)
    if not close:
        return None
    return f"unknown command {argv[0]!r}; did you mean {close[0]!r}?"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    parser = build_parser()
    words = sys.argv[1:] if argv is None else argv
    mistyped = _mistyped_command(parser, words)
    if mistyped:
        print(f"stagefrontier: error: {printable(mistyped)}", file=sys.stderr)
        return EXIT_ERROR
    args = parser.parse_args(run_command.separate(words))
    with shown_on_stderr(logging.WARNING):  # the library's warnings, one line each
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    handler: Handler = args.handler
    try:
        status = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        # The reader (head, less) stopped reading: end quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (StageFrontierError, OSError) as exc:
        print(f"stagefrontier: error: {printable(_describe(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # the last resort: one line and a traceback file, never a dump
        print(f"stagefrontier: error: {printable(last_resort_line(exc))}", file=sys.stderr)
        return EXIT_ERROR


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
