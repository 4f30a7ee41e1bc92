"""Times of day: every window's wall-clock start and end (UTC, and the writer's offset from it)
in ``windows.jsonl``, its packet, the run report and its page; an incident's; files written
before them still read."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from html_support import simulated_run, with_incident
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.cli import main
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.incident import check_incident
from stagefrontier.formats.packet import read_packet
from stagefrontier.formats.records import read_records
from stagefrontier.formats.run_folder import load_run
from stagefrontier.formats.wall_clock import clock_cell, span_text
from stagefrontier.render.incident import render_markdown
from stagefrontier.render.text import run_report_text
from stagefrontier.sinks import PacketSink
from stagefrontier.window.merged import iso_utc

STAGES = ["data.next_wait", "model.fwd_loss_cpu_wall"]


def _utc(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _timed_run(folder: Path) -> tuple[float, float]:
    """Seven steps of ~20 ms in windows of 3 (the last holds one step); returns the wall clock
    before the first step and after the timer closed."""
    before = time.time()
    timer = StageTimer(
        config=TimerConfig(
            stages=STAGES,
            window=3,
            # windows.jsonl is written to out_dir anyway
            collection=CollectConfig(mode="local", out_dir=folder, sinks=[PacketSink(folder)]),
        )
    )
    for _ in range(7):
        with timer.step():
            for stage in STAGES:
                with timer.stage(stage):
                    time.sleep(0.01)
    timer.close()
    return before, time.time()


def test_every_window_says_when_it_ran_in_its_record_packet_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = _timed_run(tmp_path)
    records = read_records(tmp_path / "windows.jsonl")
    assert len(records) == 3
    spans = [(_utc(r["wall_clock"]["start"]), _utc(r["wall_clock"]["end"])) for r in records]
    assert before - 0.001 <= spans[0][0] and spans[-1][1] <= after + 0.001
    for (start, end), record in zip(spans, records, strict=True):
        # At least the steps' own sleeps lie between a window's start and end.
        assert end - start >= record["n_steps"] * len(STAGES) * 0.01 - 0.001, record
        assert record["wall_clock"]["utc_offset"][0] in "+-"
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start == end  # one window begins as the one before it is handed off

    run = load_run(tmp_path)
    packets = sorted((tmp_path / "packets").glob("window-*.json"))
    assert [read_packet(p).meta["wall_clock"] for p in packets] == [
        r["wall_clock"] for r in records
    ]
    text = run_report_text(run)
    assert all(clock_cell(r) in text for r in records) and " ? " not in text
    day = records[0]["wall_clock"]["start"][:10]
    assert "7 step(s)" not in text and f"{day} {records[0]['wall_clock']['start'][11:19]}-" in text

    assert main(["report", str(tmp_path), "--html"]) == 0
    capsys.readouterr()
    page = (tmp_path / "report.html").read_text()
    assert "<th>time (UTC)</th>" in page
    assert all(f"<td>{clock_cell(r)}</td>" in page for r in records)


def test_files_written_before_the_times_were_kept_still_read(tmp_path: Path) -> None:
    _timed_run(tmp_path)
    path = tmp_path / "windows.jsonl"
    old = [json.loads(line) for line in path.read_text().splitlines()]
    for record in old:
        del record["wall_clock"]
    path.write_text("".join(json.dumps(record) + "\n" for record in old))
    for packet in (tmp_path / "packets").glob("*.json"):
        packet.unlink()
    text = run_report_text(load_run(tmp_path))
    assert "Per window (times of day in UTC):" in text
    assert [span_text(r) for r in read_records(path)] == ["?", "?", "?"]


def test_a_malformed_time_is_refused_on_read(tmp_path: Path) -> None:
    _timed_run(tmp_path)
    path = tmp_path / "windows.jsonl"
    record = json.loads(path.read_text().splitlines()[0])
    record["wall_clock"]["start"] = "yesterday"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ReportFormatError, match="wall_clock"):
        read_records(path)


def test_an_incident_states_when_it_opened_and_an_old_one_reads(tmp_path: Path) -> None:
    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    incident = with_incident(folder, slow=2)
    assert "opened" not in render_markdown(check_incident(incident))  # written before
    opened = time.time_ns()
    incident["wall_clock"] = {
        "start": iso_utc(opened),
        "end": iso_utc(opened + 4 * 10**9),
        "utc_offset": "+05:30",
    }
    markdown = render_markdown(check_incident(incident))
    start = incident["wall_clock"]["start"]
    assert f"- opened, last written: {start[:10]} {start[11:19]}-" in markdown
    assert "UTC (local UTC+05:30)" in markdown
    with pytest.raises(ReportFormatError, match="wall_clock"):
        check_incident({**incident, "wall_clock": {"start": "now"}})


def test_the_local_offset_is_the_writing_hosts() -> None:
    """In a process whose local time is India's (UTC+05:30, no daylight saving)."""
    code = (
        "from stagefrontier.window.merged import wall_clock; "
        "print(wall_clock(1_800_000_000 * 10**9, 1_800_000_005 * 10**9))"
    )
    env = {**os.environ, "TZ": "Asia/Kolkata"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == (
        "{'start': '2027-01-15T08:00:00.000Z', 'end': '2027-01-15T08:00:05.000Z', "
        "'utc_offset': '+05:30'}"
    )
