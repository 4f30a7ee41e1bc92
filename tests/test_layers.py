"""The layering rule of docs/ARCHITECTURE.md ("Floors"), checked on every import of the package.

Every ``import`` and ``from ... import`` of ``src/stagefrontier`` is read from the module's
``ast``: at module level, deferred into a function, or under ``TYPE_CHECKING``. An import of
another stagefrontier module that sits on a higher floor fails, and so does a set of modules, or
of packages, that import each other around a circle; each names the two modules of an offending
import. The floors table itself gives each package one floor. Imports of other packages (torch,
optional extras) are not counted.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "stagefrontier"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
sys.path.insert(0, str(ROOT / "benchmarks"))
try:  # the drawn flows' notation, read the same way by benchmarks/flow_modules.py
    from drawn_flows import FLOW_CALL, PASSED_IN, flows_from_doc
finally:
    sys.path.remove(str(ROOT / "benchmarks"))
NAME = "stagefrontier"

Graph = dict[str, dict[str, int]]
"""module -> {imported module: line of the first such import}."""
PackageGraph = dict[str, dict[str, str]]
"""package -> {imported package: the first such import, as "module imports module (line n)"}."""


# --- reading the package ---------------------------------------------------------------------


def modules(package: Path, name: str = NAME) -> dict[str, Path]:
    """Dotted module name -> its file (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = [name, *path.relative_to(package).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(
    node: ast.AST, module: str, is_package: bool, known: Mapping[str, Path]
) -> Iterator[str]:
    """The package's modules one import statement names (``from pkg import sub`` names the
    module ``pkg.sub`` when it is one, else ``pkg``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            base = here[: len(here) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            yield sub if sub in known else target


def _owner(name: str, known: Mapping[str, Path]) -> str | None:
    """The package module ``name`` is or lies in (None outside the package)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package: Path = PACKAGE, name: str = NAME) -> Graph:
    known = modules(package, name)
    graph: Graph = {}
    for module, path in known.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, module, path.name == "__init__.py", known):
                owner = _owner(target, known) if target.split(".")[0] == name else None
                if owner is not None and owner != module:
                    edges.setdefault(owner, node.lineno)
    return graph


# --- the floors --------------------------------------------------------------------------------


def floors_from_doc(text: str) -> dict[str, int]:
    """Path pattern (``analysis/``, ``record/window.py``) -> floor, from the table under
    ``## Floors``."""
    section = text.split("\n## Floors\n", 1)[1].split("\n## ", 1)[0]
    floors = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for pattern in re.findall(r"`([^`]+)`", cells[1]):
                floors[pattern] = int(cells[0])
    return floors


def floor_of(module: str, floors: Mapping[str, int]) -> int | None:
    """The floor of the most specific pattern naming the module's file: the file itself, else
    the nearest folder above it (the package itself is ``__init__.py``)."""
    parts = module.split(".")[1:]
    if not parts:
        return floors.get("__init__.py")
    candidates = ["/".join(parts) + ".py"]
    candidates += ["/".join(parts[:i]) + "/" for i in range(len(parts), 0, -1)]
    return next((floors[c] for c in candidates if c in floors), None)


def upward_imports(graph: Graph, floors: Mapping[str, int]) -> list[str]:
    found = []
    for module, edges in sorted(graph.items()):
        here = floor_of(module, floors)
        for target, line in sorted(edges.items()):
            there = floor_of(target, floors)
            if here is not None and there is not None and there > here:
                found.append(
                    f"{module} (floor {here}) imports {target} (floor {there}), line {line}"
                )
    return found


def package_of(module: str, package: Path = PACKAGE) -> str:
    """The package a module lies in, named as the floors table names it: its folder under the
    root (``collect/``), or the module itself when it sits at the top (``errors.py``,
    ``__init__.py``)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    return f"{parts[0]}/" if (package / parts[0]).is_dir() else f"{parts[0]}.py"


def package_graph(graph: Graph, package: Path = PACKAGE) -> PackageGraph:
    found: PackageGraph = {}
    for module, edges in sorted(graph.items()):
        here = package_of(module, package)
        imports = found.setdefault(here, {})
        for target, line in sorted(edges.items()):
            there = package_of(target, package)
            if there != here and there not in imports:
                imports[there] = f"{module} imports {target} (line {line})"
    return found


def package_circle_text(path: list[str], graph: PackageGraph) -> str:
    steps = "; ".join(graph[a][b] for a, b in pairwise(path))
    return f"{' -> '.join(path)}: {steps}"


def split_floors(floors: Mapping[str, int]) -> list[str]:
    """Rows of the floors table that do not hold exactly one package: a file inside a package
    (the package then spans floors), or a row naming two folders or a folder and a file."""
    found = [
        f"{pattern} (floor {floor}) is a file inside a package"
        for pattern, floor in sorted(floors.items())
        if "/" in pattern.rstrip("/")
    ]
    rows: dict[int, list[str]] = {}
    for pattern, floor in floors.items():
        rows.setdefault(floor, []).append(pattern)
    for floor, patterns in sorted(rows.items()):
        if len(patterns) > 1 and any(p.endswith("/") for p in patterns):
            found.append(f"floor {floor} holds {', '.join(sorted(patterns))}")
    return found


def flow_problems(
    lines: list[str], floors: Mapping[str, int], package: Path = PACKAGE
) -> list[str]:
    """Each call of a drawn flow whose stated floor is not its module's, names no module, or
    climbs above its caller (the nearest line above it indented less) without being marked as
    passed in. A blank line or an unindented caption starts a new part of the flow."""
    known = modules(package)
    problems: list[str] = []
    callers: list[tuple[int, int]] = []  # (indent, floor) of the lines that call
    for number, line in enumerate(lines, 1):
        calls = FLOW_CALL.findall(line)
        indent = len(line) - len(line.lstrip())
        if not calls:
            if not line.strip() or indent <= 1:
                callers.clear()
            continue
        while callers and callers[-1][0] >= indent:
            callers.pop()
        for path, stated in calls:
            module = ".".join([NAME, *re.sub(r"<.*>", "", path).strip("/").split("/")])
            if module not in known:
                problems.append(f"line {number}: {path} is no module")
            elif floor_of(module, floors) != int(stated):
                problems.append(
                    f"line {number}: {path} is on floor {floor_of(module, floors)}, not {stated}"
                )
            if callers and int(stated) > callers[-1][1] and PASSED_IN not in line:
                problems.append(
                    f"line {number}: {path} [{stated}] climbs above its caller [{callers[-1][1]}]"
                )
        callers.append((indent, int(calls[0][1])))
    return problems


def circles(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Each circle of imports as a path ``[a, b, ..., a]``: one per strongly connected set of
    modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: Mapping[str, Mapping[str, object]], group: set[str]) -> list[str]:
    """The shortest circle through the group's first module, as ``[a, ..., a]``."""
    start = min(group)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph.get(node, {})):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child in group and child not in parent:
                parent[child] = node
                queue.append(child)
    raise AssertionError(f"no circle in {sorted(group)}")


def circle_text(path: list[str], graph: Graph) -> str:
    closing = f"{path[-2]} imports {path[-1]} (line {graph[path[-2]][path[-1]]})"
    return f"{closing}, closing the circle {' -> '.join(path)}"


# --- the package -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


@pytest.fixture(scope="module")
def floors() -> dict[str, int]:
    return floors_from_doc(ARCHITECTURE.read_text(encoding="utf-8"))


def test_every_module_has_a_floor(graph: Graph, floors: dict[str, int]) -> None:
    assert floors, "docs/ARCHITECTURE.md has no floors table under '## Floors'"
    missing = [m for m in sorted(graph) if floor_of(m, floors) is None]
    assert not missing, f"modules on no floor of docs/ARCHITECTURE.md: {missing}"


def test_no_import_goes_up_a_floor(graph: Graph, floors: dict[str, int]) -> None:
    assert sum(len(edges) for edges in graph.values()) > 100  # the package's imports were read
    upward = upward_imports(graph, floors)
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def test_no_import_circle(graph: Graph) -> None:
    found = [circle_text(path, graph) for path in circles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_package_imports_itself_around_a_circle(graph: Graph) -> None:
    packages = package_graph(graph)
    assert {"window/", "formats/", "record/", "errors.py", "__init__.py"} <= set(packages)
    found = [package_circle_text(path, packages) for path in circles(packages)]
    assert not found, "package circles:\n" + "\n".join(found)


def test_the_drawn_flows_state_true_floors_and_never_climb(floors: dict[str, int]) -> None:
    flows = flows_from_doc(ARCHITECTURE.read_text(encoding="utf-8"))
    assert set(flows) == {"a window", "an incident"}
    for title, lines in flows.items():
        assert sum(bool(FLOW_CALL.search(line)) for line in lines) > 10, title
        problems = flow_problems(lines, floors)
        assert not problems, f"the flow of {title}:\n" + "\n".join(problems)


def test_every_package_stands_on_one_floor(floors: dict[str, int]) -> None:
    split = split_floors(floors)
    assert not split, "the floors table splits or joins packages:\n" + "\n".join(split)


# --- the checker on a package made to break the rule -------------------------------------------


def test_the_checker_names_both_modules_of_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "house"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high import b  # deferred, still counted\n",
        "low/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n",
        "low/d.py": "from .c import x\nimport torch  # third-party: not counted\n",
        "high/__init__.py": "",
        "high/b.py": "from house.low.a import f\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(pkg, "house")
    floors = {"low/": 1, "high/": 2, "__init__.py": 2}
    assert graph["house.low.a"] == {"house.high.b": 2}
    assert graph["house.low.d"] == {"house.low.c": 1}
    assert upward_imports(graph, floors) == [
        "house.low.a (floor 1) imports house.high.b (floor 2), line 2"
    ]
    texts = sorted(circle_text(path, graph) for path in circles(graph))
    assert texts == [
        "house.low.a imports house.high.b (line 2), closing the circle "
        "house.high.b -> house.low.a -> house.high.b",
        "house.low.d imports house.low.c (line 1), closing the circle "
        "house.low.c -> house.low.d -> house.low.c",
    ]


def test_the_checker_finds_a_circle_of_packages_no_module_circle_shows(tmp_path: Path) -> None:
    """Two packages that lean on each other through different modules (as ``record/`` and
    ``collect/`` once did) close a circle of packages, though no module imports itself."""
    pkg = tmp_path / "house"
    for rel, text in {
        "__init__.py": "",
        "top.py": "from .low import c\n",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high.b import g  # deferred, still counted\n",
        "low/c.py": "",
        "high/__init__.py": "",
        "high/b.py": "from ..low.c import x\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(pkg, "house")
    assert circles(graph) == []
    packages = package_graph(graph, pkg)
    assert packages["top.py"] == {"low/": "house.top imports house.low.c (line 1)"}
    assert [package_circle_text(path, packages) for path in circles(packages)] == [
        "high/ -> low/ -> high/: house.high.b imports house.low.c (line 1); "
        "house.low.a imports house.high.b (line 2)"
    ]
    assert split_floors({"errors.py": 1, "low/": 2, "low/a.py": 3, "high/": 4, "top.py": 4}) == [
        "low/a.py (floor 3) is a file inside a package",
        "floor 4 holds high/, top.py",
    ]
    assert split_floors({"errors.py": 1, "top.py": 1, "low/": 2, "high/": 3}) == []


def test_the_flow_checker_finds_a_climb_a_wrong_floor_and_no_module() -> None:
    floors = {"errors.py": 1, "analysis/": 2, "window/": 3, "record/": 11, "route/": 12}
    lines = [
        " record/recorder [11]   a caller",
        "   window/rank [3]      a call down",
        "     route/router [12]  a call up",
        "     record/self_cost [11]  " + PASSED_IN,
        "   analysis/nowhere [2]",
        "   analysis/accounting [5]",
        "",
        " window/merged [3]      a new part: no caller above it",
    ]
    assert flow_problems(lines, floors) == [
        "line 3: route/router [12] climbs above its caller [3]",
        "line 5: analysis/nowhere is no module",
        "line 6: analysis/accounting is on floor 2, not 5",
    ]


def test_the_floors_table_is_read_most_specific_first() -> None:
    doc = (
        "# x\n\n## Floors\n\n| floor | modules | what |\n|---|---|---|\n"
        "| 1 | `errors.py` | e |\n| 2 | `record/window.py` | w |\n| 3 | `record/`, `cli.py` | r |\n"
        "\n## Next\n| 9 | `errors.py` | not a floor |\n"
    )
    floors = floors_from_doc(doc)
    assert floors == {"errors.py": 1, "record/window.py": 2, "record/": 3, "cli.py": 3}
    assert floor_of("stagefrontier.record.window", floors) == 2
    assert floor_of("stagefrontier.record.contexts", floors) == 3
    assert floor_of("stagefrontier.errors", floors) == 1
    assert floor_of("stagefrontier.analysis.gates", floors) is None


MAX_MODULE_LINES = 500
"""A module with one job stays small enough to read in one sitting (docs/ARCHITECTURE.md)."""


def test_every_module_is_at_most_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
