"""The pages a person opens in a browser: ``incident.html`` and ``stagefrontier report DIR
--html``. Long lines wrap, the details are HTML (not Markdown in a box), a figure that cannot be
drawn is said on the page, and the run report shows every section at 16 and at 256 ranks."""

from __future__ import annotations

import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from html_support import LONG_OP, simulated_run, with_incident
from stagefrontier.cli import main
from stagefrontier.render import html_page
from stagefrontier.route.html import write_html


class _Text(HTMLParser):
    """The page's visible text and its tags, parsed as a browser would."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)
        self.skip += tag in ("style", "title")

    def handle_endtag(self, tag: str) -> None:
        self.skip -= tag in ("style", "title")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.text.append(data)


def parsed(page: str) -> _Text:
    parser = _Text()
    parser.feed(page)
    parser.close()
    return parser


# --- incident.html ------------------------------------------------------------------------------


def test_the_incident_page_wraps_and_shows_its_details_as_html(tmp_path: Path) -> None:
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    incident = with_incident(folder, slow=2)
    page = write_html(folder / "incidents" / "w00001", incident, folder).read_text()
    assert "pre{white-space:pre-wrap;overflow-wrap:anywhere" in page
    assert "<meta name='viewport'" in page
    text = "".join(parsed(page).text)
    assert "```" not in page and "|---|" not in page and "- trigger:" not in page
    assert text.count(LONG_OP) == 2 and page.count("Op diff inside") == 1  # summary, table
    assert "trigger: an actionable window (window 1)" in text and "a reason" in text
    assert "step time during capture: 60.0 ms, outside it 50.0 ms" in text
    assert "differ by at most 1.0 percentage points" in text


def test_without_matplotlib_the_incident_page_says_its_figures_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    incident = with_incident(folder, slow=2)
    real = importlib.util.find_spec

    def no_matplotlib(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(html_page.importlib.util, "find_spec", no_matplotlib)
    page = write_html(folder / "incidents" / "w00001", incident, folder).read_text()
    assert "data:image/png" not in page
    text = "".join(parsed(page).text)
    assert "Figures not drawn (Frontier of the worst step, Shares over time)" in text
    assert "pip install 'stagefrontier[plot]'" in text and " incident " in text


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_with_matplotlib_the_incident_page_embeds_both_figures(tmp_path: Path) -> None:
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    page = write_html(
        folder / "incidents" / "w00001", with_incident(folder, slow=2), folder
    ).read_text()
    assert page.count("data:image/png;base64,") == 2 and "not drawn" not in page


# --- stagefrontier report DIR --html -------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "slow"), [(16, 13), (256, 201)])
def test_the_run_report_page_has_every_section(
    tmp_path: Path, ranks: int, slow: int, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = simulated_run(tmp_path / "run", ranks, 4, slow=slow)
    with_incident(folder, slow=slow)
    assert main(["report", str(folder), "--html"]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "report.html")
    page = (folder / "report.html").read_text()
    text = "".join(parsed(page).text)
    for heading in (
        "Run",
        "Share of exposed step time per window",
        "Who sets the frontier",
        "Verdict per window",
        "Regressions",
        "StageFrontier next to rank-local timers",
        "Incidents (1)",
        "StageFrontier's own cost",
    ):
        assert f"<h2>{heading}</h2>" in page, heading
    assert f"ranks: {ranks}" in text and "hosts:" in text
    assert page.count("<rect ") == 4 * 3  # three stages with a share in each of four windows
    assert "href='incidents/w00001/incident.html'" in page and LONG_OP in text
    assert len(re.findall(rf"Rank {slow}@node\d+'s data loading", text)) >= 3  # verdicts
    leaders = page.split("<h2>Who sets the frontier</h2>")[1].split("<h2>")[0]
    rows = re.findall(r"<tr><td><b>(\d+)</b>", leaders)
    assert str(slow) in rows and len(rows) <= 8  # the ranks that lead, not all of them
    assert f"of {ranks} rank(s) set the frontier" in leaders
    assert len(page) < 400_000 + 200 * ranks


def test_report_html_refuses_a_name_that_is_not_a_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = simulated_run(tmp_path / "run", 2, 1, slow=1)
    assert main(["report", str(folder), "--html", str(tmp_path / "r.png")]) == 2
    assert "name a *.html" in capsys.readouterr().err
    assert main(["report", str(folder), "--html", str(tmp_path / "new" / "r.html")]) == 0
    assert (tmp_path / "new" / "r.html").is_file()
