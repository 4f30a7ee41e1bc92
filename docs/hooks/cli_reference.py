"""MkDocs hook: the command reference in cli.md, written from the argparse parser at build time.

The page holds the marker ``<!-- cli-reference -->``; this hook replaces it with one section per
subcommand (its description, usage and a table of its options), read from
``stagefrontier.cli.build_parser`` of the checked-out sources. The reference therefore cannot
drift from the parser; ``tests/test_docs.py`` checks that every option appears.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
_SRC = Path(__file__).resolve().parents[2] / "src"


def cell(text: str) -> str:
    # a bracket would read as a cross-reference to mkdocstrings' autorefs
    cleaned = " ".join(text.split()).replace("|", "\\|")
    return cleaned.replace("[", "\\[").replace("]", "\\]")


def _option_row(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        if action.nargs != 0 and action.metavar is not None:
            names += f" `{action.metavar}`"
        elif action.nargs != 0 and action.choices is None:
            names += f" `{action.dest.upper()}`"
    else:
        names = f"`{action.metavar or action.dest}`"
    help_text = (action.help or "") % {"default": action.default, "prog": ""}
    if not help_text and action.default not in (None, False, argparse.SUPPRESS):
        help_text = f"default: {action.default}"
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        help_text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    return f"| {names} | {cell(help_text)} |"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def cli_reference_markdown(parser: argparse.ArgumentParser) -> str:
    """The command reference of ``parser``: a section per subcommand, in registration order."""
    lines: list[str] = []
    helps = _command_helps(parser)
    for name, sub in _subparsers(parser).items():
        lines += [f"### stagefrontier {name}", ""]
        about = sub.description or helps.get(name)
        if about:
            lines += [cell(about), ""]
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        lines += ["```", usage, "```", ""]
        rows = [
            _option_row(action)
            for action in sub._actions
            if not isinstance(action, argparse._HelpAction)
        ]
        if rows:
            lines += ["| argument | what it does |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def build_cli_parser() -> argparse.ArgumentParser:
    """The parser of the checked-out sources (put first on the path, ahead of any install)."""
    if str(_SRC) not in sys.path:
        sys.path.insert(0, str(_SRC))
    from stagefrontier.cli import build_parser

    return build_parser()


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference_markdown(build_cli_parser()))
