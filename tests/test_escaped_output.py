"""Names read from packets reach the terminal escaped: a stage or host name holding ESC
sequences, newlines or other control characters cannot restyle the terminal or forge a line of
any text output (window line, analyze and run reports, compare, verdict, CLI errors)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from cli_support import console_script
from stagefrontier.formats.packet import Packet, write_packet
from stagefrontier.render.escape import printable, printable_lines
from stagefrontier.render.text import window_details
from stagefrontier.render.verdict import verdict

FORGED = "window 9 steps 0-0 | exposed 1.0 ms/step | top fwd 100% | labels none"
EVIL_STAGE = f"data\x1b[2J\n{FORGED}"
EVIL_HOSTS = {"0": "node-a\x1b]0;owned\x07", "1": "node-b\r\u202e\x9b31m"}
STAGES = [EVIL_STAGE, "fwd", "bwd"]
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Any control character but the newline (which only the report itself may write)."""


def evil_packet() -> tuple[Packet, dict[str, object]]:
    d = np.full((8, 2, 3), 0.01)
    d[:, 1, 0] = 0.2  # the evil stage is the top stage, led by rank 1 (host node-b)
    meta: dict[str, object] = {"window": 0, "first_step": 0, "last_step": 7, "hosts": EVIL_HOSTS}
    return Packet.of_window(d, sf.analyze(d, STAGES), meta=meta), meta


def assert_clean(text: str) -> None:
    assert not RAW.search(text), repr(text)
    assert all(not line.startswith("window 9") for line in text.splitlines()), text
    assert "data\\x1b[2J\\nwindow 9" in text  # the name is shown, escaped


def test_printable_escapes_every_control_character_once() -> None:
    assert printable("a\x1b[31mb\nc\td\x7f\x9b\u202e") == "a\\x1b[31mb\\nc\\td\\x7f\\x9b\\u202e"
    assert printable(printable(EVIL_STAGE)) == printable(EVIL_STAGE)
    assert printable("data.next_wait 40% é 数据") == "data.next_wait 40% é 数据"
    assert printable_lines(["a\nb", "c"]) == "a\\nb\nc"


def test_window_line_and_verdict_cannot_be_forged() -> None:
    packet, meta = evil_packet()
    line = window_details(packet.report, meta)
    assert "\n" not in line
    assert_clean(line)
    assert "node-b\\r\\u202e\\x9b31m" in line  # the lead rank's host, escaped
    assert "\n" not in verdict(packet.report, meta) and not RAW.search(verdict(packet.report, meta))


def test_cli_reports_of_a_packet_or_a_record_cannot_be_forged(tmp_path: Path) -> None:
    packet, meta = evil_packet()
    (tmp_path / "run" / "packets").mkdir(parents=True)
    path = write_packet(tmp_path / "run" / "packets" / "window-000000.json", packet)
    records = tmp_path / "records" / "windows.jsonl"  # a folder without packets
    records.parent.mkdir()
    records.write_text(json.dumps({**meta, **packet.report.to_dict()}) + "\n")
    for args in (
        ["analyze", str(path)],
        ["report", str(tmp_path / "run")],
        ["report", str(records.parent)],
        ["analyze", str(records), "--window", "0"],
        ["compare", str(path), str(path)],
    ):
        proc = subprocess.run(
            [*console_script(), *args], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert_clean(proc.stdout)


def test_an_error_quoting_a_name_stays_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stagefrontier.cli import main

    missing = tmp_path / "no\x1b[2Jsuch\nfile"
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not RAW.search(err)
    assert "no\\x1b[2Jsuch\\nfile" in err


def test_the_run_page_shows_such_names_escaped(tmp_path: Path) -> None:
    """Issue 37, item 12: ``report --html`` wrote the stage's ESC bytes and newline raw into
    the page (the HTML escaping leaves control characters alone)."""
    from stagefrontier.cli import main

    packet, _ = evil_packet()
    (tmp_path / "run" / "packets").mkdir(parents=True)
    write_packet(tmp_path / "run" / "packets" / "window-000000.json", packet)
    page = tmp_path / "run.html"
    assert main(["report", "--html", str(page), str(tmp_path / "run")]) == 0
    text = page.read_text()
    assert not RAW.search(text), RAW.search(text)
    assert "data\\x1b[2J\\nwindow 9" in text
    assert "node-b\\r\\u202e\\x9b31m" in text
    assert f"\n{FORGED}" not in text
