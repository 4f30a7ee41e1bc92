"""Markup a run carries into its names (a stage, an op or function, a folder, a reason) shows on
every page as text: the pages are rendered by templates with autoescaping, so no caller escapes
and none can forget to."""

from __future__ import annotations

import ast
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from html_support import STAGES, simulated_run, with_incident
from rank_support import run_job
from source_support import source_nodes, string_constants
from stagefrontier.cli import main
from stagefrontier.render.incident import HERE
from stagefrontier.route.html import write_html

INJECTED = "<script>alert(1)</script><img src=x onerror='alert(2)'>\"'&amp;"
"""Markup, both quote characters and an entity: the text a page must show as written."""

STAGE = f"model.fwd{INJECTED}"
OP = f"train.py(12): step {INJECTED}"
REASON = f"a reason {INJECTED}"
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "h4", "p", "b", "ul",
    "li", "div", "table", "tr", "th", "td", "code", "pre", "br", "span", "a", "img", "svg",
    "polyline", "text", "rect",
}  # fmt: skip


class _Page(HTMLParser):
    """Tags, attributes and text, parsed as a browser would."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Both pages of a run whose folder, second stage, op diff and reasons carry markup; each
    with the text it must show (the incident's commands run in its folder: they name it
    ``.``, so its path is on the report page only)."""
    stages = (STAGES[0], STAGE, *STAGES[2:])
    folder = simulated_run(tmp_path / f"run{INJECTED.replace('/', '|')}", 4, 3, 2, stages)
    incident = with_incident(
        folder,
        slow=2,
        stage=STAGE,
        op_diff=[{"name": OP, "suspect_ms_per_step": 40.1, "reference_ms_per_step": 0.0}],
        trace_shares={STAGE: 0.7, STAGES[0]: 0.3},
        live_shares={STAGE: 0.7, STAGES[0]: 0.3},
        reasons=[REASON],
    )
    incident_page = write_html(folder / "incidents" / "w00001", incident, folder)
    assert main(["report", str(folder), "--html"]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "report.html")
    return {
        "incident": (incident_page, (HERE, STAGE, OP, REASON)),
        "report": (folder / "report.html", (str(folder), STAGE, OP)),
    }


def test_markup_in_names_and_paths_is_text_on_every_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, (path, shown) in _pages(tmp_path, capsys).items():
        raw = path.read_text()
        page = _Page()
        page.feed(raw)
        page.close()
        tags = {tag for tag, _ in page.tags}
        assert tags <= PAGE_TAGS, (name, tags - PAGE_TAGS)
        attributes = {attr for _, attrs in page.tags for attr, _ in attrs}
        assert not [a for a in attributes if a.startswith("on")], (name, attributes)
        assert "<script" not in raw, name
        text = "".join(page.text)
        for part in shown:
            assert part in text, (name, part)  # shown as written, the entity included


def test_no_module_writes_markup_or_escapes_it_itself() -> None:
    """Markup lives in the templates only: no string of the library's code holds a page's tag,
    and no module calls ``html.escape`` (the template engine escapes)."""
    tag = re.compile(r"</?(html|body|table|tr|td|th|h[1-6]|p|ul|li|div|span|svg|rect|pre|img)\b")
    found = [f"{module}:{line}" for module, line, text in string_constants() if tag.search(text)]
    for module, node in source_nodes():
        imported = (
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        ) + ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if "html" in imported:
            found.append(f"{module}:{node.lineno} imports html")
    assert found == []


def test_jinja2_loads_with_the_first_page_or_the_router_not_the_library() -> None:
    """A job without pages never imports Jinja2; a router imports it as it starts (StageTimer's
    construction), not on its thread at the first incident."""
    pytest.importorskip("torch")
    script = (
        "import sys\n"
        "import stagefrontier\n"
        "from stagefrontier.route import profiler_session\n"
        "before = 'jinja2' in sys.modules\n"
        "profiler_session.warm_up()\n"
        "print(before, 'jinja2' in sys.modules)\n"
    )
    done = run_job([sys.executable, "-c", script], 300)
    assert done.stdout.split() == ["False", "True"], done.stdout
