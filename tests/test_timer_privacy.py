"""Nothing outside ``record/`` reads or writes a private attribute of the timer, rebinds one of
its attributes or swaps a class under it: the router and the framework callbacks go through the
timer's instrumentation (``StageTimer.instrumentation``, ``record.instrumentation``)."""

from __future__ import annotations

import ast
from pathlib import Path

import stagefrontier

SRC = Path(stagefrontier.__file__).parent
TIMER_NAMES = frozenset({"timer", "_timer", "stage_timer"})
"""How the library's modules name a timer they hold (``timer``, ``self._timer``, ...)."""
REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _is_timer(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in TIMER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in TIMER_NAMES


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _reflected(node: ast.Call) -> str | None:
    """``getattr(timer, "_x")`` and the like: the private name; ``vars(timer)``: ``vars``."""
    func = node.func
    if not isinstance(func, ast.Name) or not node.args or not _is_timer(node.args[0]):
        return None
    if func.id == "vars":
        return "vars"
    if func.id in REFLECTION and len(node.args) > 1:
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value):
            return name.value
    return None


def touches(tree: ast.AST) -> list[tuple[int, str]]:
    """Each (line, what) where ``tree`` touches a timer's private attribute, its instance dict,
    or assigns an attribute of the timer."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_timer(node.value):
            if _private(node.attr):
                found.append((node.lineno, node.attr))
            elif isinstance(node.ctx, ast.Store | ast.Del):
                found.append((node.lineno, f"{node.attr} (assigned)"))
        elif isinstance(node, ast.Call):
            name = _reflected(node)
            if name is not None:
                found.append((node.lineno, name))
    return sorted(found)


def test_no_module_outside_record_touches_the_timers_private_attributes() -> None:
    """Before: route/capture.py (19 places), route/router.py (7), route/worker_profile.py and
    integrations/_timer.py (2) read and wrote the timer's fields, swapped its step context's
    class and rebound ``timer.fetch``."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC)
        if module.parts[0] == "record":
            continue
        for line, what in touches(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{module}:{line} {what}")
    assert offenders == [], offenders


def test_the_scan_sees_each_way_of_touching_the_timer() -> None:
    source = "\n".join(
        [
            "self._timer._capture = True",
            "timer._step_ctx.__class__ = object",
            "getattr(self._timer, '_closed', False)",
            "vars(timer).pop('fetch', None)",
            "timer.fetch = fetch",
            "timer.rank + self._timer.step",  # public reads are fine
            "getattr(timer, 'rank')",
        ]
    )
    assert touches(ast.parse(source)) == [
        (1, "_capture"),
        (2, "_step_ctx"),
        (3, "_closed"),
        (4, "vars"),
        (5, "fetch (assigned)"),
    ]
