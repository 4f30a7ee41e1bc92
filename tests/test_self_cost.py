"""What StageFrontier reports about its own cost: per-rank fields on every window, rank 0's
``self_cost`` object in the record and the packet, the log line above its threshold, the metric
sinks, and old records without it."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from recorder_support import DATA, FWD, CaptureCollector, read_records
from stagefrontier import RESIDUAL_STAGE, CollectConfig, StageTimer, TimerConfig, load_window
from stagefrontier.formats.packet import read_packet
from stagefrontier.record.self_cost import context_cost_ns
from stagefrontier.render.text import SELF_COST_LINE_FRACTION, self_cost_text
from stagefrontier.sinks import CsvSink, PacketSink
from stagefrontier.window.rank import COMPONENTS, RankWindow, self_cost_summary

COST_FIELDS = (
    "contexts_entered",
    "context_cost_ns",
    "handoff_ns",
    "thread_cpu_ns",
    "router_cpu_ns",
    "capture_ns",
)


def steps(timer: StageTimer, n: int) -> None:
    for _ in range(n):
        with timer.step():
            with timer.stage(DATA):
                pass
            with timer.stage(FWD):
                sum(range(200))


def test_every_window_carries_its_rank_cost_fields() -> None:
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(stages=[DATA, FWD], window=5), collector=collector)
    steps(timer, 15)
    timer.close()
    windows = collector.windows
    assert len(windows) == 3
    for w in windows:
        assert all(getattr(w, name) >= 0 for name in COST_FIELDS)
        assert w.contexts_entered == 5 * 3  # each step: the step and its two stages
        assert w.context_cost_ns == context_cost_ns(False, StageTimer) >= 1
    # The boundary before a window is measured with it: none before the first.
    assert windows[0].handoff_ns == 0 and all(w.handoff_ns > 0 for w in windows[1:])


def test_rank_zero_record_and_packet_hold_the_self_cost_object(tmp_path: Path) -> None:
    timer = StageTimer(
        config=TimerConfig(
            stages=[DATA, FWD], window=5, collection=CollectConfig(mode="local", out_dir=tmp_path)
        )
    )
    steps(timer, 15)
    timer.close()
    records = read_records(tmp_path)
    assert len(records) == 3
    for record in records:
        cost = record["self_cost"]
        assert set(cost) == {*COMPONENTS, "context_cost_ns", "fraction"}
        for name, spread in cost.items():
            assert set(spread) == {"max", "median"}, name
            assert spread["max"] >= spread["median"] >= 0, name
        parts = sum(cost[name]["max"] for name in COMPONENTS if name != "total_s")
        assert cost["total_s"]["max"] == pytest.approx(parts)  # one rank: max is that rank
        assert cost["fraction"]["max"] == pytest.approx(
            cost["total_s"]["max"] / record["step_wall_s"]
        )
        assert record["paused_steps"] == 0
    # The analysis thread ran between windows: its CPU time is in the later windows.
    assert any(r["self_cost"]["threads_cpu_s"]["max"] > 0 for r in records[1:])


def test_the_summary_takes_max_and_median_over_ranks() -> None:
    def window(
        rank: int, contexts: int, handoff_ns: int, thread_ns: int, router_ns: int = 0
    ) -> RankWindow:
        durations = np.full((2, 2), 500_000_000, dtype=np.int64)  # 1 s per step
        return RankWindow(
            window=0,
            first_step=0,
            last_step=1,
            rank=rank,
            stages=(DATA, RESIDUAL_STAGE),
            durations_ns=durations,
            wall_ns=durations.sum(axis=1),
            contexts_entered=contexts,
            context_cost_ns=1000,
            handoff_ns=handoff_ns,
            thread_cpu_ns=thread_ns,
            router_cpu_ns=router_ns,
        )

    ranks = [
        window(0, 4, 0, 20_000_000, router_ns=1_000_000_000),
        window(1, 4, 2_000_000, 0),
        window(2, 6000, 0, 0),
    ]
    cost = self_cost_summary(ranks)
    assert cost["hot_path_s"] == {"max": pytest.approx(6e-3), "median": pytest.approx(4e-6)}
    assert cost["handoff_s"] == {"max": pytest.approx(2e-3), "median": 0.0}
    assert cost["threads_cpu_s"] == {"max": pytest.approx(0.02), "median": 0.0}
    # The router's capture and trace reduction are their own part (rank 0's second here).
    assert cost["router_cpu_s"] == {"max": pytest.approx(1.0), "median": 0.0}
    assert cost["total_s"]["max"] == pytest.approx(1.020004)
    assert cost["fraction"] == {"max": pytest.approx(0.510002), "median": pytest.approx(0.003)}
    assert cost["context_cost_ns"] == {"max": 1000.0, "median": 1000.0}


def test_the_log_line_shows_the_cost_only_above_its_threshold() -> None:
    def record(fraction: float, router_s: float = 0.0) -> dict[str, object]:
        spread = {"max": 0.004, "median": 0.001}
        return {
            "self_cost": {
                "hot_path_s": spread,
                "handoff_s": spread,
                "threads_cpu_s": spread,
                "router_cpu_s": {"max": router_s, "median": 0.0},
                "total_s": {"max": 0.012 + router_s, "median": 0.003},
                "fraction": {"max": fraction, "median": fraction / 2},
            }
        }

    assert self_cost_text(record(SELF_COST_LINE_FRACTION)) == ""
    assert self_cost_text({}) == ""  # a record from before self_cost
    text = self_cost_text(record(0.023))
    assert text.startswith(
        "stagefrontier cost 2.3% of step time (up to 12.0 ms in this window on one rank; "
        "the most any rank spent per part: "
    )
    assert "hot path 4.0 ms" in text and "collection 4.0 ms" in text
    assert "router" not in text
    # An incident's capture and reduction (1.5 s of the router's CPU against 12 ms of collection
    # in a 1.2 s step budget) is said in the incident line, not as an alarm in the window's.
    assert self_cost_text(record(1.5 / 1.2, router_s=1.5)) == ""
    text = self_cost_text(record(0.04 * 1.512 / 0.012, router_s=1.5))
    assert text.startswith("stagefrontier cost 4.0% of step time (up to 12.0 ms in this window")
    assert "router" not in text


def test_sinks_export_it_and_old_records_without_it_still_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stagefrontier")
    csv_path = tmp_path / "windows.csv"
    timer = StageTimer(
        config=TimerConfig(
            stages=[DATA, FWD],
            window=5,
            collection=CollectConfig(
                mode="local", out_dir=tmp_path, sinks=[CsvSink(csv_path), PacketSink(tmp_path)]
            ),
        )
    )
    steps(timer, 10)
    timer.close()
    records = read_records(tmp_path)
    with csv_path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["self_cost_fraction"]) for r in rows] == pytest.approx(
        [r["self_cost"]["fraction"]["max"] for r in records], rel=1e-5
    )
    packet = read_packet(tmp_path / "packets" / "window-000000.json")
    assert packet.meta["self_cost"] == records[0]["self_cost"]
    assert packet.meta["paused_steps"] == 0
    # A tiny step does cost more than 1% here: the window's details line (DEBUG) says so.
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and r.getMessage().startswith("window ")
    ]
    shown = [r["self_cost"]["fraction"]["max"] > SELF_COST_LINE_FRACTION for r in records]
    assert ["stagefrontier cost" in line for line in lines] == shown

    old = tmp_path / "old"
    old.mkdir()
    stripped = [
        {k: v for k, v in r.items() if k not in ("self_cost", "paused_steps", "paused_ranges")}
        for r in records
    ]
    (old / "windows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stripped))
    loaded = load_window(old / "windows.jsonl", window=1)
    assert loaded.report.n_steps == 5
