"""The documentation site's generated parts and the README's length."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from stagefrontier.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def _hook() -> ModuleType:
    path = ROOT / "docs" / "hooks" / "cli_reference.py"
    spec = importlib.util.spec_from_file_location("cli_reference_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_lists_every_command_and_option_of_the_parser() -> None:
    hook = _hook()
    parser = build_parser()
    page = hook.on_page_markdown((ROOT / "docs" / "cli.md").read_text(), page=None)
    assert hook.MARKER not in page
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(commands.choices) >= 8
    for name, sub in commands.choices.items():
        assert f"### stagefrontier {name}\n" in page
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}`" in page, f"{name} {option} is missing from the CLI page"
            if action.help and action.help != argparse.SUPPRESS and action.option_strings:
                first_words = hook.cell(" ".join(action.help.split()[:4]))
                assert first_words in page, (name, action.help)


def test_the_readme_stays_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def _printed_text() -> str:
    """The package's source with adjacent string literals joined (a message split over lines
    reads whole) and backticks dropped."""
    text = "".join(p.read_text() for p in sorted((ROOT / "src" / "stagefrontier").rglob("*.py")))
    return re.sub(r'"\s*\n\s*f?"', "", text).replace("`", "")


def test_every_message_quoted_in_troubleshooting_is_printed_by_the_code() -> None:
    printed = _printed_text()
    rows = [
        line.split(" | ")[0]
        for line in (ROOT / "docs" / "troubleshooting.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    assert len(rows) >= 30
    for row in rows:
        for quoted in re.findall(r"`([^`]+)`", row):
            for piece in quoted.split("..."):
                piece = piece.strip(" ()")
                if len(piece) >= 8:
                    assert piece in printed, f"troubleshooting.md quotes {piece!r}: not in the code"
