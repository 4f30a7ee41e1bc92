"""Summary packets: a hierarchical window's packet holds the combined node summary, stays the
same size whatever the number of ranks, and ``stagefrontier analyze`` reads it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from cli_support import console_script
from stagefrontier.formats.summary_packet import (
    SummaryPacket,
    read_summary_packet,
    write_summary_packet,
)

STAGES = list(sf.DEFAULT_STAGES)
PER_NODE = 8


def node_window(ranks: int, seed: int = 0) -> np.ndarray:
    """Steady stage times, with rank 5 stalling 120 ms in its data stage."""
    rng = np.random.default_rng(seed)
    medians = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])
    d = medians * rng.lognormal(0.0, 0.05, size=(12, ranks, len(STAGES)))
    d[:, 5, 0] += 0.120
    return d


def combined(ranks: int) -> sf.WindowSummary:
    d = node_window(ranks)
    return sf.combine(
        [
            sf.summarize(d[:, i : i + PER_NODE], range(i, i + PER_NODE), STAGES)
            for i in range(0, ranks, PER_NODE)
        ]
    )


def packet_of(summary: sf.WindowSummary) -> SummaryPacket:
    side = sf.SideEvidence(missing_ranks=(summary.n_ranks + 3,), gather_ok=False)
    report = sf.analyze_summary(summary, side=side)
    return SummaryPacket.of_summary(summary, report, side=side, meta={"window": 2, "nodes": 4})


def test_round_trip_reanalyzes_to_the_stored_report(tmp_path: Path) -> None:
    packet = packet_of(combined(32))
    path = write_summary_packet(tmp_path / "window-2.json", packet)
    back = read_summary_packet(path)
    assert back.report == packet.report == back.reanalyze()
    assert back.meta == {"window": 2, "nodes": 4} and back.side == packet.side
    assert back.report.leaders[sf.DATA_STAGE] == 5


def test_size_is_fixed_whatever_the_ranks(tmp_path: Path) -> None:
    sizes = {}
    for ranks in (64, 1024, 4096):
        path = write_summary_packet(tmp_path / f"{ranks}.json", packet_of(combined(ranks)))
        sizes[ranks] = path.stat().st_size
    rank_list = 4 * 4 / 3  # bytes per rank of the (compressed, base64) rank list, at most
    assert sizes[4096] - rank_list * 4096 < sizes[64]
    # The flat packet holds R columns: it grows far beyond.
    assert sizes[4096] < 4096 * 12 * len(STAGES) * 8 / 8


def test_stagefrontier_analyze_reads_a_summary_packet(tmp_path: Path) -> None:
    packet = packet_of(combined(32))
    path = write_summary_packet(tmp_path / "window-2", packet)  # told by content, not name
    done = subprocess.run(
        [*console_script(), "analyze", str(path), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sf.WindowReport.from_json(done.stdout) == packet.report
    text = subprocess.run(
        [*console_script(), "analyze", str(path)], capture_output=True, text=True
    ).stdout
    assert "meta: window=2, nodes=4" in text and "telemetry_limited" in text


def test_a_damaged_summary_packet_is_one_error_line(tmp_path: Path) -> None:
    good = json.loads(
        write_summary_packet(tmp_path / "a.json", packet_of(combined(16))).read_text()
    )
    cases = {
        "codec": {**good, "summary": {"codec": "raw", "data": ""}},
        "not valid base64": {**good, "summary": {**good["summary"], "data": "!!"}},
        "bad magic": {**good, "summary": {**good["summary"], "data": "QUFBQUFBQUFBQUFBQUFB"}},
        "missing field": {k: v for k, v in good.items() if k != "gates"},
        "version": {**good, "version": 7},
    }
    for expected, obj in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(obj))
        with pytest.raises(sf.ReportFormatError, match=expected):
            sf.load_window(path)
        done = subprocess.run(
            [*console_script(), "analyze", str(path)], capture_output=True, text=True
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_report_and_summary_must_agree() -> None:
    summary = combined(16)
    other = sf.analyze_summary(combined(24))
    with pytest.raises(sf.ReportFormatError, match="but the summary covers"):
        SummaryPacket.of_summary(summary, other)
