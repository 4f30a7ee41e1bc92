"""MkDocs hook: the settings reference in configuration.md, written from the code at build time.

The page holds the marker ``<!-- config-reference -->``; this hook replaces it with one table
per part of the configuration tree (``TimerConfig``, the ``SamplingConfig``, ``CollectConfig``
and ``ProfilerRouter`` it holds, the ``Gates`` and ``RegressionConfig`` those hold), each
setting with its default, read from the dataclasses' fields, and a table of the environment
variables from ``stagefrontier.environment.VARIABLES`` with the setting of the tree each gives.
The reference therefore cannot drift from the code; ``tests/test_configuration.py`` checks that
every setting appears.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- config-reference -->"
_SRC = Path(__file__).resolve().parents[2] / "src"


def _default(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(value):
        return f"`{type(value).__name__}()`"
    return f"`{value!r}`".replace("|", "\\|")


def _field_default(field: dataclasses.Field[Any]) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return _default(field.default_factory())
    return _default(field.default)


def parts() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Each part of the tree: its name, where it goes, and its settings with their defaults."""
    if str(_SRC) not in sys.path:
        sys.path.insert(0, str(_SRC))
    from stagefrontier import (
        CollectConfig,
        Gates,
        ProfilerRouter,
        RegressionConfig,
        SamplingConfig,
        TimerConfig,
    )

    out = []
    for cls, where in (
        (TimerConfig, "`StageTimer(config=TimerConfig(...))`"),
        (SamplingConfig, "`TimerConfig(sampling=SamplingConfig(...))`"),
        (CollectConfig, "`TimerConfig(collection=CollectConfig(...))`"),
        (Gates, "`CollectConfig(gates=Gates(...))`, `ProfilerRouter(gates=Gates(...))`"),
        (RegressionConfig, "`CollectConfig(regression=RegressionConfig(...))`"),
        (ProfilerRouter, "`TimerConfig(router=ProfilerRouter(...))`"),
    ):
        fields = [(f.name, _field_default(f)) for f in dataclasses.fields(cls) if f.init]
        out.append((cls.__name__, where, fields))
    return out


def variables() -> list[tuple[str, str, str, str]]:
    from stagefrontier.environment import VARIABLES

    return [
        (v.name, _default(v.default), v.what, f"`TimerConfig.{v.field}`" if v.field else "")
        for v in VARIABLES.values()
    ]


def config_reference_markdown() -> str:
    lines: list[str] = []
    for name, where, settings in parts():
        lines += [f"### {name}", "", f"Given as {where}.", ""]
        lines += ["| setting | default |", "|---|---|"]
        lines += [f"| `{setting}` | {default} |" for setting, default in settings]
        lines.append("")
    lines += ["### Environment variables", ""]
    lines += ["| variable | default | sets | in the tree |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {default} | {what} | {tree} |" for n, default, what, tree in variables()]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_reference_markdown())
