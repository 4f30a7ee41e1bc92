"""``report``, ``report --html``, ``plot`` and ``compare`` on a long run folder (issue 38 item 1,
issue 37 item 9): a real 4-rank run with a profiler-router incident (the session's
``forward_stall_run``) repeated to 1,500 windows by the long-run benchmark's own generator.
The report says what it summarized, keeps the incident and the windows the router slowed in
full, and its page and text hold a fixed number of buckets whatever the run's length."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from bench_support import BENCHMARKS
from stagefrontier.formats import sides
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.run_digest import BUCKETS, SHOWN_ALL
from stagefrontier.formats.run_folder import load_run
from test_cli_bad_inputs import run

WINDOWS = 1500


@pytest.fixture(scope="module")
def long_folder(forward_stall_run: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from long_run import generate
    finally:
        sys.path.remove(str(BENCHMARKS))
    out = tmp_path_factory.mktemp("long") / "run"
    generate(forward_stall_run.out, out, WINDOWS)
    return out


@pytest.fixture(scope="module")
def source_windows(forward_stall_run: Any) -> int:
    return len(forward_stall_run.records)


def test_the_report_says_what_it_summarized_and_keeps_the_flagged_windows(
    long_folder: Path, source_windows: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run_windows = load_run(long_folder)
    assert run_windows.count == WINDOWS and run_windows.summarized
    assert len(run_windows.buckets) == BUCKETS
    assert sum(b.count for b in run_windows.buckets) == WINDOWS
    # the windows the router slowed happened once, in the source run's span: kept in full
    slowed = [int(facts["window"]) for facts, _ in run_windows.slowed.windows]
    assert slowed and max(slowed) < source_windows, slowed
    shown = [int(meta["window"]) for _, meta in run_windows.windows]
    assert set(slowed) <= set(shown) and {0, WINDOWS - 1} <= set(shown)
    assert len(shown) < SHOWN_ALL

    code, out, err = run(["report", str(long_folder)], capsys)
    assert code == 0 and not err, err
    assert f"{WINDOWS} window(s)" in out
    assert f"This run holds {WINDOWS} windows, too many to show one by one" in out
    assert f"summarized in {BUCKETS} buckets" in out
    table = out.split("Summary of every window, by bucket:")[1].split("Per window")[0]
    assert len(re.findall(r"^  \d+-\d+ ", table, re.MULTILINE)) == BUCKETS, table
    rows = out.split("Per window (times of day in UTC):")[1].split("Routing set")[0]
    for window in slowed:
        assert re.search(rf"^ +{window}  ", rows, re.MULTILINE), rows
    assert re.search(r"^Incidents \(\d+;", out, re.MULTILINE), out[-2000:]
    assert f"/{WINDOWS} windows" in out  # labels and routing sets count every window


def test_the_page_holds_buckets_not_windows_and_keeps_the_incident(
    long_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = long_folder / "report.html"
    code, _, err = run(["report", str(long_folder), "--html", str(page_path)], capsys)
    assert code == 0 and not err, err
    page = page_path.read_text()
    assert f"This run holds {WINDOWS} windows, too many to show one by one" in page
    timeline = page.split("<svg")[1].split("</svg>")[0]
    assert "min-max of the bucket" in timeline  # the band
    columns = set(re.findall(r"<title>windows (\d+-\d+): ", timeline))
    assert len(columns) == BUCKETS
    leaders = page.split("<h2>Who sets the frontier</h2>")[1].split("<h2>")[0]
    assert leaders.count("<th>") == BUCKETS + 1  # rank, then one column a bucket
    assert "Incident " in page and "incident.html" in page
    assert len(page.encode()) < 600_000  # a window's row only for the kept ones


def test_plot_draws_the_buckets(long_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    code, out, err = run(["plot", str(long_folder)], capsys)
    assert code == 0 and not err, err
    for name in ("frontier_worst_step.png", "shares_over_time.png"):
        assert (long_folder / name).stat().st_size > 10_000, out


def test_compare_takes_evenly_spaced_windows_past_a_side_s_bound(
    long_folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    half = WINDOWS // 2
    first, second = f"{long_folder}:0-{half - 1}", f"{long_folder}:{half}-"
    code, out, err = run(["compare", first, second], capsys)
    assert code == 0 and not err, err  # within the bound: every window, nothing said
    assert "exposed" in out
    cells = read_packet(next((long_folder / "packets").glob("window-*.json"))).d.size
    monkeypatch.setattr(sides, "SIDE_CELLS", 100 * cells)  # a side of 100 windows at most
    code, _out, err = run(["compare", first, second], capsys)
    assert code == 0, err
    said = [line for line in err.splitlines() if "comparing one window in" in line]
    assert len(said) == 2 and f"its {half} windows" in said[0], err
    found = re.search(r"comparing one window in (\d+) \((\d+) windows", said[0])
    assert found and 90 <= int(found[2]) <= 100, said[0]
