"""The output folder's disk budget and attempts (``sinks.disk_budget``, ``sinks.output_folder``).

One real 2-rank job (``budget_support``) runs twice into one folder with a 2 MiB budget: the
second launch is the job resumed from a checkpoint into the folder of the first. Each launch
slows the forward stage of some windows (three injected regressions in all), and opens one
profiler-router incident on window 1, asked by hand. Its records, packets and incidents outgrow
the budget, so older packets are compacted away while it runs, and old healthy windows' records
cut down to their summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from budget_support import BUDGET_MB, BUDGET_SLOW, BUDGET_WINDOWS
from stagefrontier.cli.main import main
from stagefrontier.formats.compacted import listed_windows
from stagefrontier.formats.incident import incident_window, list_incidents
from stagefrontier.render.regression_text import regression_text
from stagefrontier.sinks import JsonlSink
from stagefrontier.sinks.disk_budget import folder_bytes
from stagefrontier.sinks.output_folder import next_attempt


@pytest.fixture(scope="module")
def resumed_run(budget_run: Path) -> Path:
    """The session's resumed job (``conftest.budget_run``); the budget is checked before any
    test of this module writes its report into it."""
    return budget_run


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]


def test_the_folder_stays_within_its_budget_and_lists_what_it_compacted(
    resumed_run: Path,
) -> None:
    assert folder_bytes(resumed_run) <= BUDGET_MB << 20
    compactions = [
        json.loads(line) for line in (resumed_run / "compacted.jsonl").read_text().splitlines()
    ]
    assert compactions and all(c["bytes_after"] <= c["budget_bytes"] for c in compactions)
    assert sum(c["packets_dropped"] for c in compactions) > 0
    held = {p.name for p in (resumed_run / "packets").iterdir()}
    without = sorted(
        (r["attempt"], r["window"])
        for r in _records(resumed_run)
        if f"window-{r['window']:06d}"
        + (f".attempt-{r['attempt']}" if r["attempt"] else "")
        + ".json"
        not in held
    )
    listed = [c[key] for c in compactions for key in ("windows", "flagged_windows")]
    assert without and sorted(w for text in listed for w in listed_windows(text)) == without


def test_a_resumed_job_continues_the_folder_as_its_next_attempt(resumed_run: Path) -> None:
    records = _records(resumed_run)
    windows = [(r["attempt"], r["window"]) for r in records]
    assert sorted(windows) == [
        (a, w) for a in (0, 1) for w in range(BUDGET_WINDOWS)
    ]  # none overwritten
    lines = [json.loads(line) for line in (resumed_run / "attempts.jsonl").read_text().splitlines()]
    ends = {line["attempt"]: line for line in lines if line["event"] == "end"}
    assert [line["attempt"] for line in lines if line["event"] == "start"] == [0, 1]
    assert {a: (e["first_step"], e["last_step"], e["windows"]) for a, e in ends.items()} == {
        a: (0, BUDGET_WINDOWS * 10 - 1, BUDGET_WINDOWS) for a in (0, 1)
    }


def test_the_report_shows_the_regressions_and_the_restart(resumed_run: Path) -> None:
    records = {(r["attempt"], r["window"]): r for r in _records(resumed_run)}
    injected = []
    for attempt, slow in BUDGET_SLOW.items():
        for first in slow:  # each regression flagged in one of its two windows at least
            flagged = [records[(attempt, w)] for w in (first, first + 1)]
            flagged = [r for r in flagged if r["regression"]]
            assert flagged, (attempt, first)
            injected += flagged
    packets = resumed_run / "packets"
    for record in injected:  # flagged: kept
        suffix = f".attempt-{record['attempt']}" if record["attempt"] else ""
        assert (packets / f"window-{record['window']:06d}{suffix}.json").exists()
    assert main(["report", str(resumed_run), "--html"]) == 0
    page = (resumed_run / "report.html").read_text()
    assert "restart attempts" in page and "cut the records of" in page
    for record in injected:
        # as the page's templates escape it (an apostrophe is &#39;, not html.escape's &#x27;)
        assert str(escape(regression_text(record["regression"]))) in page


def test_each_attempt_keeps_its_incident_of_the_same_window(
    resumed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    incidents = {i["id"]: i for i in list_incidents(resumed_run)}
    ids = ["w00001-manual0", "w00001-attempt1-manual0"]
    assert sorted(incidents) == sorted(ids)  # neither overwrote the other
    assert {incident_window(name) for name in incidents} == {(0, 1), (1, 1)}
    assert all(i["window"] == 1 and i["trigger"] == "manual" for i in incidents.values())
    for name in incidents:  # the disk budget keeps the packet of each incident's own window
        attempt, window = incident_window(name) or (-1, -1)
        suffix = f".attempt-{attempt}" if attempt else ""
        assert (resumed_run / "packets" / f"window-{window:06d}{suffix}.json").exists()
    assert main(["report", str(resumed_run)]) == 0
    report = capsys.readouterr().out
    listed = [line.split()[1] for line in report.splitlines() if line.startswith("  incident ")]
    assert sorted(listed) == sorted(ids)


def test_old_healthy_records_are_cut_down_to_their_summary(
    resumed_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compactions = [
        json.loads(line) for line in (resumed_run / "compacted.jsonl").read_text().splitlines()
    ]
    cut = sorted(w for c in compactions for w in listed_windows(c["records"]))
    assert cut and sum(c["records_cut"] for c in compactions) == len(cut)
    records = {(r["attempt"], r["window"]): r for r in _records(resumed_run)}
    assert sorted(key for key, r in records.items() if r.get("compacted")) == cut
    incidents = {incident_window(i["id"]) for i in list_incidents(resumed_run)}
    whole = [key for key, r in records.items() if r["regression"] or key in incidents]
    assert whole and not any(records[key].get("compacted") for key in whole)
    assert main(["report", str(resumed_run)]) == 0
    said = capsys.readouterr()
    assert f"cut the records of {len(cut)} old healthy window(s)" in said.out
    line = f"{len(cut)} window(s) of windows.jsonl keep only their summary"
    assert line in said.err
    assert main(["plot", str(resumed_run)]) == 0
    assert line in capsys.readouterr().err


def test_a_torchrun_restart_takes_its_restart_count_unless_the_folder_holds_it(
    tmp_path: Path,
) -> None:
    assert next_attempt(tmp_path, 0) == 0  # an empty folder
    (tmp_path / "attempts.jsonl").write_text('{"attempt": 0, "event": "start"}\n')
    assert next_attempt(tmp_path, 1) == 1  # torchrun's first restart
    assert next_attempt(tmp_path, 0) == 1  # a new job resumed into the folder
    (tmp_path / "attempts.jsonl").unlink()
    (tmp_path / "windows.jsonl").write_text('{"run_id": "run", "attempt": 2}\n{"run_id"')
    assert next_attempt(tmp_path, 0) == 3  # an older folder: its records say, a torn one not


def _manual_capture_id(out: Path) -> str:
    """The id of a capture asked by hand of rank 0's router writing to ``out`` before the
    router took any window: the id its request carries in a real store."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from stagefrontier import ProfilerRouter
    from stagefrontier.route.coordinator import Coordinator
    from stagefrontier.route.requests import REQUEST_KEY, CaptureRequest, RequestChannel

    store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
    channel = RequestChannel(store)
    config = ProfilerRouter(capture_timeout_s=0.0)
    coordinator = Coordinator(config, out_dir=str(out), channel=channel, current_step=lambda: 0)
    coordinator.request_capture([0], 2)
    coordinator.tick()
    data = channel.read(REQUEST_KEY)
    assert data is not None
    return CaptureRequest.decode(data).id


def test_a_manual_capture_before_the_router_took_a_window_names_the_windows_attempt(
    tmp_path: Path,
) -> None:
    """The sinks have written the first window (``attempts.jsonl`` says attempt 0 started), and
    the router thread has not taken it yet when it opens a capture asked by hand: the id names
    attempt 0, the window's (before, the folder seemed to hold attempt 0 already and the id
    named attempt 1). Asked before any window of a job resumed into the folder, it names the
    next attempt, and the first window then takes that same attempt."""
    from test_disk_budget_rules import _windows

    first, other = _windows()[:2]
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    sink = JsonlSink(fresh)
    sink.write(first)
    assert _manual_capture_id(fresh) == "w00000-manual0"
    sink.close()

    resumed.mkdir()
    (resumed / "attempts.jsonl").write_text('{"attempt": 0, "event": "start"}\n')
    assert _manual_capture_id(resumed) == "w00000-attempt1-manual0"
    sink = JsonlSink(resumed)
    sink.write(other)
    sink.close()
    assert [r["attempt"] for r in _records(resumed)] == [1]
