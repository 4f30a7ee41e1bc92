"""A capture's trace written a profiler session at a time and joined (``route.trace_parts``),
with real ``torch.profiler`` sessions in this process: the joined file is one Chrome trace with
every session's events, read back by the router's trace reader; a part that is not Kineto's,
or a session whose write failed, leaves no file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stagefrontier.reducers.kineto import load_trace_ranges  # noqa: E402
from stagefrontier.route.trace_parts import TraceParts  # noqa: E402

SESSIONS = 3


def _session(step: int) -> Any:
    """A stopped profiler session around one "step" of real operators in a named range."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    with torch.profiler.record_function(f"stagefrontier.step#{step}"):
        x = torch.randn(64, 64)
        (x @ x).relu().sum()
    prof.stop()
    return prof


def _names(events: list[dict[str, Any]]) -> list[str]:
    return [e["name"] for e in events if e.get("ph") == "X"]


def test_parts_join_into_one_trace_with_every_sessions_events(tmp_path: Path) -> None:
    parts = TraceParts(tmp_path / "incident", "rank0.pt.trace.json.gz")
    expected: set[str] = set()
    for step in range(SESSIONS):
        prof = _session(step)
        expected |= {event.name for event in prof.events()}  # what the session recorded
        parts.append(parts.save(prof))
    assert parts.parts == SESSIONS and parts.error is None
    trace = parts.join()
    assert trace == tmp_path / "incident" / "rank0.pt.trace.json.gz"
    assert [p.name for p in trace.parent.iterdir()] == [trace.name]  # the parts are gone
    with gzip.open(trace, "rt", encoding="utf-8") as handle:
        joined = json.load(handle)
    names = _names(joined["traceEvents"])
    assert expected <= set(names)
    assert "baseTimeNanoseconds" in joined and "traceName" in joined
    steps = [n for n in names if n.startswith("stagefrontier.step#")]
    assert steps == [f"stagefrontier.step#{s}" for s in range(SESSIONS)]
    assert names.count("aten::mm") == SESSIONS  # one a session, none lost or doubled
    # The router's own reader (the one its reduction uses) takes it as one trace.
    header, events = load_trace_ranges(trace)
    assert sorted(_names(events)) == sorted(names)
    assert header["baseTimeNanoseconds"] == joined["baseTimeNanoseconds"]


def test_a_part_that_is_not_kinetos_leaves_no_trace(tmp_path: Path) -> None:
    """A session whose JSON is not Kineto's layout (here an application's own trace writer in
    its place) fails the trace, whatever parts came before it."""

    class OtherWriter:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"events": []}', encoding="utf-8")

    parts = TraceParts(tmp_path, "rank1.pt.trace.json.gz")
    parts.append(parts.save(_session(0)))
    parts.append(parts.save(OtherWriter()))
    assert parts.save(_session(1)) is None  # not tried after a failure
    assert parts.parts == 1
    with pytest.raises(OSError, match="not in Kineto's layout"):
        parts.join()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_fails_the_trace_and_keeps_no_part(tmp_path: Path) -> None:
    """The incident folder's place is taken by a file: the first part cannot be written; the
    next one is not tried, and the join says why."""
    blocked = tmp_path / "incident"
    blocked.write_text("a file, not a folder", encoding="utf-8")
    parts = TraceParts(blocked, "rank0.pt.trace.json.gz")
    assert parts.save(_session(0)) is None
    assert parts.save(_session(1)) is None
    assert parts.parts == 0 and isinstance(parts.error, OSError)
    with pytest.raises(OSError):
        parts.join()
    assert [p.name for p in tmp_path.iterdir()] == ["incident"]


def test_a_trace_reported_failed_is_removed_whole(tmp_path: Path) -> None:
    """A writer killed after its trace was in place reports no path: the router then removes
    the trace with the temporary files, so the "nothing was kept" it says is true."""
    parts = TraceParts(tmp_path, "rank0.pt.trace.json.gz")
    parts.append(parts.save(_session(0)))
    trace = parts.join()
    (tmp_path / f".{trace.name}.part9.tmp").write_text("a killed writer's part")
    kept = tmp_path / "rank1.pt.trace.json.gz"  # another rank's trace stays
    kept.write_text("another rank's")
    parts.remove()
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]
