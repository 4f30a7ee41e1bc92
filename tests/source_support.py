"""The library's own source, parsed: for tests that check a rule over every module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import stagefrontier

SRC = Path(stagefrontier.__file__).parent


def source_nodes() -> Iterator[tuple[str, ast.AST]]:
    """Every node of every module, with the module's path under the package (``cli/main.py``)."""
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            yield module, node


def string_constants() -> Iterator[tuple[str, int, str]]:
    """Every string constant of the library: its module, line and text."""
    for module, node in source_nodes():
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield module, node.lineno, node.value
