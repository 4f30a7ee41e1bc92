"""Every ``STAGEFRONTIER_*`` environment variable is named and read in ``environment.py`` only,
and the configuration page lists every setting of the tree and every variable, from the code."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest

import stagefrontier as sf
from source_support import SRC, source_nodes, string_constants
from stagefrontier import environment
from stagefrontier.environment import VARIABLES, current_attempt
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.limits import limit

DOCS = Path(__file__).resolve().parents[1] / "docs"
NAME = re.compile(r"STAGEFRONTIER_[A-Z_]+")
PARTS = (sf.TimerConfig, sf.SamplingConfig, sf.CollectConfig, sf.Gates, sf.RegressionConfig)
"""The dataclasses of the configuration tree (the router's settings are a ProfilerRouter's)."""


def test_only_the_environment_module_names_a_variable_as_a_string() -> None:
    """A variable's name as a value of its own (a key read from ``os.environ``) stands in
    ``environment.py`` only; elsewhere names appear in prose (messages, docstrings)."""
    named = [
        (module, line, text) for module, line, text in string_constants() if NAME.fullmatch(text)
    ]
    assert named and {module for module, _, _ in named} == {"environment.py"}, named


def _reads_the_environment(node: ast.AST) -> bool:
    """``os.environ.get(...)``, ``os.environ[...]`` read, or ``os.getenv(...)``."""

    def is_os(node: ast.AST, attr: str) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == attr
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        return is_os(func, "getenv") or (func.attr == "get" and is_os(func.value, "environ"))
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and is_os(node.value, "environ")
    )


def test_a_module_given_a_variable_leaves_reading_it_to_the_environment_module() -> None:
    """A module that imports one of ``environment``'s variables (a ``Variable`` or a table of
    them) reads no process environment itself: the value comes from ``environment``'s readers.
    (``deadline.py`` read ``STAGEFRONTIER_CLOSE_DEADLINE_S`` itself, by the variable's name.)"""

    def is_variable(value: object) -> bool:
        if isinstance(value, dict):
            return bool(value) and all(isinstance(v, environment.Variable) for v in value.values())
        return isinstance(value, environment.Variable)

    variables = {name for name, value in vars(environment).items() if is_variable(value)}
    given, reading = set(), set()
    for module, node in source_nodes():
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("environment"):
            if variables & {alias.name for alias in node.names}:
                given.add(module)
        elif _reads_the_environment(node):
            reading.add(module)
    assert given and reading, (given, reading)  # the scan sees both
    assert not given & reading, sorted(given & reading)


def test_every_variable_mentioned_is_registered() -> None:
    mentioned = {m for path in SRC.rglob("*.py") for m in NAME.findall(path.read_text())}
    assert mentioned <= set(VARIABLES), mentioned - set(VARIABLES)


def test_the_variables_are_read_at_each_use(monkeypatch: pytest.MonkeyPatch) -> None:
    assert limit("cells") == VARIABLES["STAGEFRONTIER_MAX_CELLS"].default
    monkeypatch.setenv("STAGEFRONTIER_MAX_CELLS", "1_000")
    assert limit("cells") == 1000
    monkeypatch.setenv("STAGEFRONTIER_MAX_CELLS", "many")
    with pytest.raises(ReportFormatError, match="STAGEFRONTIER_MAX_CELLS='many'"):
        limit("cells")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("STAGEFRONTIER_RUN_ID", "nightly")
    assert current_attempt()[0] == "nightly"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic")
    assert current_attempt()[0] == "elastic"


def _reference() -> str:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import config_reference

        return config_reference.config_reference_markdown()
    finally:
        sys.path.remove(str(DOCS / "hooks"))


def test_the_configuration_page_lists_every_setting_and_variable() -> None:
    page = (DOCS / "configuration.md").read_text()
    assert "<!-- config-reference -->" in page
    reference = _reference()
    sections = dict(
        (part.split("\n", 1)[0], part) for part in reference.split("### ")[1:]
    )  # heading -> its table
    parts = (*PARTS, sf.ProfilerRouter)
    expected = {cls.__name__: [f.name for f in dataclasses.fields(cls) if f.init] for cls in parts}
    for heading, names in expected.items():
        assert all(f"| `{name}` |" in sections[heading] for name in names), heading
    variables = sections["Environment variables"]
    for variable in VARIABLES.values():
        assert f"| `{variable.name}` | `{variable.default!r}` |" in variables
        assert not variable.field or f"| `TimerConfig.{variable.field}` |" in variables
    for cls in PARTS:  # the page's tree names each part
        assert f"{cls.__name__}(" in page


def test_each_variable_of_the_tree_names_a_field_of_it() -> None:
    """A variable's ``field`` is a dotted path of fields from a default TimerConfig down."""
    tree = [v for v in VARIABLES.values() if v.field]
    assert {v.name for v in tree} >= {"STAGEFRONTIER_OUT", "STAGEFRONTIER_WINDOW"}
    for variable in tree:
        *parts, last = variable.field.split(".")
        part: object = sf.TimerConfig()
        for name in parts:
            part = getattr(part, name)
        assert dataclasses.is_dataclass(part), variable.name
        assert last in {f.name for f in dataclasses.fields(part)}, variable.name
