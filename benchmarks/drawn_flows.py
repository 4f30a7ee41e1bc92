"""The flows ``docs/ARCHITECTURE.md`` draws, read as the modules they name.

A flow is the first code block under a ``### The flow of ...`` heading; each line names modules
with their floor, ``window/rank [3]``, indented under the module that calls them. The layering
test checks the floors a flow states (``tests/test_layers.py``); ``flow_modules.py`` counts the
modules a flow draws and holds them against the modules that run.
"""

from __future__ import annotations

import re
from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
FLOW_CALL = re.compile(r"([a-z_]+(?:/[a-z_]*(?:<[a-z|]+>)?)?)(?:\.[A-Za-z_]+)* \[(\d+)\]")
"""A module named in a drawn flow with its floor: ``window/rank [3]``, ``collect/<a|b> [10]``
(one of a folder's modules), ``logs [8]``."""
PASSED_IN = "◄ passed in"


def flows_from_doc(text: str) -> dict[str, list[str]]:
    """Title -> the lines of the first code block under each ``### The flow of ...`` heading."""
    found = {}
    for part in text.split("\n### The flow of ")[1:]:
        title = part.split("\n", 1)[0]
        found[title] = part.split("```\n", 1)[1].split("```", 1)[0].splitlines()
    return found


def drawn_modules(lines: list[str]) -> list[str]:
    """The modules a flow names, each once, in the order drawn: ``window/rank``, or
    ``collect/<local|store>`` for one of several."""
    drawn: list[str] = []
    for line in lines:
        for path, _floor in FLOW_CALL.findall(line):
            if path not in drawn:
                drawn.append(path)
    return drawn


def alternatives(drawn: str) -> list[str]:
    """The modules one drawn name stands for: ``collect/<local|store>`` is either of two."""
    match = re.fullmatch(r"(.*/)<(.*)>", drawn)
    return [drawn] if match is None else [match[1] + name for name in match[2].split("|")]
