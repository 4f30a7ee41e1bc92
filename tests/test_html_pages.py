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
from stagefrontier.environment import MiB
from stagefrontier.render import html_page
from stagefrontier.route.html import write_html
from stagefrontier.route.offline import draw_pages
from stagefrontier.sinks.disk_budget import DiskBudget, folder_bytes


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
    assert "Figures not drawn (Frontier of the captured steps 24-28, Shares over time)" in text
    assert "pip install 'stagefrontier[plot]'" in text and " incident " in text


def test_the_incident_page_shows_what_differs_and_the_workers_functions(tmp_path: Path) -> None:
    """The op diff lists the rows whose sides differ, then counts the rest; the suspect's
    DataLoader workers' functions are on the page, as in incident.md."""
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    incident = with_incident(folder, slow=2)
    same = [
        {"name": f"op{i}", "suspect_ms_per_step": 0.005 * i, "reference_ms_per_step": 0.0}
        for i in range(17)
    ]
    worker = {"name": "slow_sample", "suspect_ms_per_batch": 240.0}
    incident["op_diff"] += same
    incident["worker_op_diff"] = [
        {**worker, "reference_ms_per_batch": 0.5, "calls_per_batch": 8.0},
        {"name": "collate", "suspect_ms_per_batch": 0.2, "reference_ms_per_batch": 0.2,
         "calls_per_batch": 1.0},
    ]  # fmt: skip
    page = write_html(folder / "incidents" / "w00001", incident, folder, figures=False)
    text = "".join(parsed(page.read_text()).text)
    assert LONG_OP in text and "op3" not in text
    assert "17 more rows under 0.1 ms (incident.json lists them all)." in text
    assert "Rank 2's DataLoader workers" in text and "slow_sample240.000.508" in text
    assert "1 more row under 0.1 ms" in text and "collate" not in text


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_with_matplotlib_the_incident_page_embeds_both_figures(tmp_path: Path) -> None:
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    page = write_html(
        folder / "incidents" / "w00001", with_incident(folder, slow=2), folder
    ).read_text()
    assert page.count("data:image/png;base64,") == 2 and "not drawn" not in page


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_the_figures_drawn_after_the_run_keep_to_the_folders_disk_budget(tmp_path: Path) -> None:
    """The process a live router starts as the run ends (``draw_pages``) draws a page's
    figures only where they fit the run folder's disk budget, and leaves them out once the
    budget had to compact the folder; the note says why and how to draw them."""
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    with_incident(folder, slow=2)
    incident = folder / "incidents" / "w00001"
    held = folder_bytes(folder)

    draw_pages([str(incident)], held + MiB)
    assert (incident / "incident.html").read_text().count("data:image/png;base64,") == 2

    draw_pages([str(incident)], held)  # the figures would take it past
    page = (incident / "incident.html").read_text()
    text = " ".join("".join(parsed(page).text).split())
    assert "data:image/png" not in page
    assert f"they would take the run folder past its disk budget of {held / MiB:.3g} MiB" in text
    assert f"incident {incident}` to draw them" in text

    DiskBudget(folder, held // 2).written(None, folder / "attempts.jsonl", 0)  # compacts
    assert (folder / "compacted.jsonl").exists()
    draw_pages([str(incident)], 100 * MiB)
    page = (incident / "incident.html").read_text()
    text = " ".join("".join(parsed(page).text).split())
    assert "data:image/png" not in page
    assert "the run folder reached its disk budget of 100 MiB (compacted.jsonl)" in text


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
    # The verdicts: each window's own, or the earlier window whose verdict it repeats.
    verdicts = text.split("Verdict per window")[1].split("Regressions")[0]
    said = re.findall(rf"Rank {slow}@node\d+'s data loading", verdicts)
    assert said and len(said) + len(re.findall(r"same as window \d+", verdicts)) >= 3, verdicts
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


def test_the_cost_sentence_and_table_state_the_same_figures(tmp_path: Path) -> None:
    """Window 1 paid for a capture: 900 ms on the training thread and 110 ms of the router's
    threads, in a 1.016 s budget. The sentence and the table give the same share of step time
    (the router's threads left out of both, in a column of their own)."""
    from stagefrontier.formats.run_folder import load_run
    from stagefrontier.render.run_html import run_html

    run = load_run(simulated_run(tmp_path / "run", 4, 2, slow=2))
    part = {"max": 0.002, "median": 0.001}
    run.windows[1][1]["self_cost"] = {
        "hot_path_s": part,
        "handoff_s": part,
        "threads_cpu_s": part,
        "capture_s": {"max": 0.9, "median": 0.0},
        "router_cpu_s": {"max": 0.11, "median": 0.0},
        "total_s": {"max": 1.016, "median": 0.1},
        "fraction": {"max": 0.2, "median": 0.02},
    }
    page = run_html(run, tmp_path / "report.html")
    section = page.split("<h2>StageFrontier's own cost</h2>")[1]
    said = re.search(r"stagefrontier cost ([\d.]+)% of step time", section)
    shown = re.search(r"<tr><td>1</td><td class='num'>([\d.]+)%</td>", section)
    assert said and shown, section[:2000]
    assert float(said.group(1)) == pytest.approx(float(shown.group(1)), abs=0.05)
    assert float(shown.group(1)) == pytest.approx(100 * 0.2 * 0.906 / 1.016, abs=0.005)
    assert "profiler capture 900.0 ms on the training thread" in section
    assert "<td class='num'>900.0</td><td class='num'>110.0</td></tr>" in section


def test_a_window_the_router_slowed_is_named_in_the_regressions(tmp_path: Path) -> None:
    """Its captured steps ran 400 ms slower: named as the router's cost, not hidden behind "no
    window was slower"; a window it captured in at the usual pace is not named."""
    from stagefrontier.formats.run_folder import load_run
    from stagefrontier.render.run_html import run_html

    for captured_ms, named in ((400, True), (0, False)):
        folder = simulated_run(tmp_path / str(captured_ms), 4, 4, slow=2, captured_ms=captured_ms)
        with_incident(folder, slow=2)
        page = run_html(load_run(folder), folder / "report.html")
        text = "".join(parsed(page).text)
        regressions = text.split("Regressions")[1].split("StageFrontier next to")[0]
        said = "router's capture slowed it" in regressions and "window 1 ran " in regressions
        assert said == named, regressions
