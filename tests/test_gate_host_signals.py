"""Rank 0's host signals as ``compare``'s gate reads them: what ``collect.host_signals`` gives
over a window is what a packet may hold, and a packet holding other is refused by name."""

from __future__ import annotations

from pathlib import Path

import msgspec

from stagefrontier.collect.host_signals import Snapshot, between, snapshot
from stagefrontier.formats.stored_report import HostSignals
from test_compare import healthy, write_run
from test_compare_gate import BAD_INPUT, gate


def test_the_signals_of_a_window_are_what_a_record_may_hold() -> None:
    before = snapshot()
    signals = between(before, snapshot())
    msgspec.convert(signals, HostSignals)  # raises on a value out of its declared range
    assert signals["cpu_per_wall"] >= 0  # os.times works everywhere
    assert signals.get("cpus", 1) >= 1


def test_counters_that_went_back_give_no_negative_signal() -> None:
    # A cgroup moved between two reads: its counters start again; the hypervisor's are odd.
    before = Snapshot(0.0, 0.0, steal=(50, 1000), throttled=(9, 400.0))
    after = Snapshot(1.0, 0.5, steal=(40, 1100), throttled=(2, 10.0))
    signals = between(before, after)
    assert signals["steal_share"] == 0.0
    assert signals["throttled_periods"] == 0 and signals["throttled_ms"] == 0.0
    msgspec.convert(signals, HostSignals)


def test_a_packet_with_malformed_host_signals_is_refused_by_name(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)])
    bad = write_run(tmp_path / "new", [healthy(2)], host_signals={"cpu_per_wall": -1.0})
    proc = gate(str(base), str(bad), "--fail-above", "10%")
    assert proc.returncode == BAD_INPUT, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "cpu_per_wall" in proc.stderr, proc.stderr
