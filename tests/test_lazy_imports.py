"""What importing the package loads: a training script's ``from stagefrontier import StageTimer``
loads the recorder and what an in-process timer runs, not the trace readers, the offline
loaders, the reports of a run folder, the profiler router, the collectors across ranks or the
optional metrics backends; every public name of a lazily importing package still resolves to
the object its module defines, and the names type checkers read agree with the names listed."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import stagefrontier
from stagefrontier import collect, sinks

SRC = Path(stagefrontier.__file__).parent
LAZY_PACKAGES = [stagefrontier, sinks, collect]

NOT_FOR_A_TIMER = (
    "stagefrontier.reducers",
    "stagefrontier.load",
    "stagefrontier.route",
    "stagefrontier.cli",
    "stagefrontier.formats.run_folder",
    "stagefrontier.collect.gloo",
    "stagefrontier.collect.hierarchical",
    "stagefrontier.collect.store",
    "stagefrontier.sinks.csv_file",
    "stagefrontier.sinks.otel",
    "stagefrontier.sinks.prometheus",
    "stagefrontier.sinks.tensorboard",
    "stagefrontier.sinks.wandb",
)


def test_importing_the_timer_loads_only_what_a_timer_runs() -> None:
    code = (
        "import sys\n"
        "from stagefrontier import CollectConfig, StageTimer, TimerConfig\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('stagefrontier'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = proc.stdout.split()
    assert "stagefrontier.record.recorder" in loaded
    assert "stagefrontier.collect.local" in loaded  # the in-process collector is what it builds
    heavy = [m for m in loaded if m.startswith(NOT_FOR_A_TIMER)]
    assert heavy == [], heavy


def _type_checking_names(package: object) -> dict[str, str]:
    """The names the package imports under ``TYPE_CHECKING``, each with its module's path."""
    path = Path(package.__file__)  # type: ignore[attr-defined]
    names: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                for alias in stmt.names:
                    names[alias.asname or alias.name] = "." * stmt.level + (stmt.module or "")
    return names


@pytest.mark.parametrize("package", LAZY_PACKAGES, ids=lambda p: p.__name__)
def test_every_lazy_name_resolves_to_its_modules_object(package: object) -> None:
    declared = _type_checking_names(package)
    assert declared, "no names under TYPE_CHECKING"
    listed = set(dir(package))
    for name, module in declared.items():
        assert name in listed, name
        value = getattr(package, name)
        where = importlib.import_module(module, package.__name__)  # type: ignore[attr-defined]
        expected = getattr(where, name, None) or importlib.import_module(
            f"{module}.{name}",
            package.__name__,  # type: ignore[attr-defined]
        )
        assert value is expected, name


@pytest.mark.parametrize("package", LAZY_PACKAGES, ids=lambda p: p.__name__)
def test_the_listed_names_are_the_ones_type_checkers_read(package: object) -> None:
    exported = set(getattr(package, "__all__", ()))
    declared = set(_type_checking_names(package))
    eager = {n for n in exported if n in vars(package) and n not in declared}
    assert declared <= exported | set(dir(package))
    for name in exported - eager:
        assert name in declared, f"{name} is exported but type checkers do not see it"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        stagefrontier.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
