"""A package's public names imported on first use (PEP 562).

A package that re-exports names from its modules imports them all when it is imported. Where
most users need a few of them (a training script needs the timer, not the trace readers or the
optional metrics backends), the package lists its names per module instead and lets
``lazy_exports`` import each module when one of its names is first read; the names are then
kept in the package like any imported name. Type checkers read the same names from imports
under ``TYPE_CHECKING``, which the package keeps beside the list.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__`` for ``modules``: each module's path
    relative to ``package`` (``"base"``, or ``".analysis.gates"`` for a module of a sibling
    package) and the public names it holds (a name that is a submodule of that module is
    imported as one)."""
    where = {name: module for module, names in modules.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module_name = where.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f".{module_name}", package)
        if hasattr(module, name):
            value = getattr(module, name)
        else:
            value = importlib.import_module(f".{module_name}.{name}", package)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
