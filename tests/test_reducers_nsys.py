"""The Nsight Systems reducer on SQLite files built here with the export's schema (no GPU).

The tables follow the published ``nsys export --type sqlite`` schema: ``StringIds(id, value)``,
``NVTX_EVENTS(start, end, eventType, rangeId, category, color, text, globalTid, endGlobalTid,
textId, domainId, ...)`` with eventType 59 (push/pop) and 60 (start/end) ranges, and
``ENUM_NSYS_EVENT_TYPE(id, name, label)``. Expected matrices are computed by hand.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from stagefrontier.cli import main
from stagefrontier.reducers import (
    MisalignedStepsError,
    MissingRanksError,
    MissingStagesError,
    TraceFormatError,
    reduce_nsys,
)
from stagefrontier.reducers.detect import detect_format
from stagefrontier.reducers.nsys import split_global_tid

DATA, FWD, BWD, CB, OPT = (
    "data.next_wait",
    "model.fwd_loss_cpu_wall",
    "model.backward_cpu_wall",
    "callbacks.cpu_wall",
    "optim.step_cpu_wall",
)
TIMED = (DATA, FWD, BWD, CB, OPT)
MS = 1_000_000  # ns
PUSH_POP, START_END, MARK, DOMAIN_CREATE = 59, 60, 34, 75

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
    textId INTEGER REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER,
    int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
    floatValue REAL, jsonTextId INTEGER, jsonText TEXT
);
"""
ENUM = [
    (33, "NvtxCategory", "NVTX Category"),
    (34, "NvtxMark", "NVTX Mark"),
    (39, "NvtxThread", "NVTX Thread"),
    (59, "NvtxPushPopRange", "NVTX PushPop Range"),
    (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
    (75, "NvtxDomainCreate", "NVTX Domain Create"),
    (76, "NvtxDomainDestroy", "NVTX Domain Destroy"),
]
STAGE_MS = (2, 10, 20, 1, 5)
"""Per-step stage durations in ms on a healthy rank; a step's wall is their sum + 2 ms."""


def global_tid(pid: int, tid: int) -> int:
    """Nsight's serialized id: a hardware/VM id above bit 48, pid in bits 24-47, tid below."""
    return (1 << 56) | (pid << 24) | tid


class Report:
    """Rows for one NVTX_EVENTS table."""

    def __init__(self, pid: int = 4242, tid: int = 4242) -> None:
        self.rows: list[tuple[int, int | None, int, str | None, int, int | None]] = []
        self.strings: dict[str, int] = {}
        self.gtid = global_tid(pid, tid)

    def range(
        self,
        name: str,
        start: int,
        end: int | None,
        *,
        event_type: int = PUSH_POP,
        registered: bool = False,
        gtid: int | None = None,
    ) -> None:
        text_id = None
        text: str | None = name
        if registered:
            text_id = self.strings.setdefault(name, len(self.strings) + 1)
            text = None
        self.rows.append((start, end, event_type, text, gtid or self.gtid, text_id))

    def steps(
        self,
        step_ids: Sequence[int],
        *,
        extra_ms: dict[str, float] | None = None,
        step_name: str = "stagefrontier.step#{}",
        origin: int = 1_000 * MS,
    ) -> np.ndarray:
        """Write one step range and five stage ranges per step; returns the expected [N, 6] ns."""
        expected = []
        t = origin
        for i, step_id in enumerate(step_ids):
            durations = [
                int((ms + (extra_ms or {}).get(name, 0.0)) * MS)
                for name, ms in zip(TIMED, STAGE_MS, strict=True)
            ]
            wall = sum(durations) + 2 * MS
            self.range(step_name.format(step_id), t, t + wall)
            cursor = t + MS // 2
            for name, dur in zip(TIMED, durations, strict=True):
                self.range(name, cursor, cursor + dur, registered=i % 2 == 1)
                cursor += dur + MS // 4
            expected.append([*durations, wall - sum(durations)])
            t += wall + MS
        return np.array(expected, dtype=np.int64)

    def write(self, path: Path, *, enum: bool = True) -> Path:
        with closing(sqlite3.connect(path)) as db:
            db.executescript(SCHEMA)
            if enum:
                db.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)", ENUM)
            db.executemany(
                "INSERT INTO StringIds VALUES (?, ?)",
                [(i, name) for name, i in self.strings.items()],
            )
            db.executemany(
                "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                self.rows,
            )
            db.commit()
        return path


def two_ranks(
    folder: Path, *, slow_ms: float = 50.0, names: str = "report_rank{}.sqlite"
) -> np.ndarray:
    """Rank 1 is slow in its data stage; returns the expected d [N, 2, 6] in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = []
    for rank in (0, 1):
        report = Report(pid=100 + rank, tid=100 + rank)
        extra = {DATA: slow_ms} if rank == 1 else None
        expected.append(report.steps(range(10, 16), extra_ms=extra))
        report.write(folder / names.format(rank))
    return np.stack(expected, axis=1) * 1e-9


def test_split_global_tid() -> None:
    assert split_global_tid(global_tid(1234, 5678)) == ("1234", "5678")
    assert split_global_tid(global_tid(0xFFFFFF, 1)) == (str(0xFFFFFF), "1")


def test_two_rank_reports_reduce_to_the_written_durations(tmp_path: Path) -> None:
    expected = two_ranks(tmp_path)
    reduced = reduce_nsys(tmp_path)
    assert reduced.source == "nsys" and reduced.ranks == (0, 1)
    assert reduced.step_ids == tuple(range(10, 16))
    np.testing.assert_allclose(reduced.d, expected, rtol=0, atol=1e-15)
    assert reduced.overlap_error_s == 0.0
    assert any("carry no world size" in note for note in reduced.notes)
    report = reduced.analyze()
    assert report.top1 == DATA and report.leaders[DATA] == 1


def test_registered_strings_and_text_are_both_names(tmp_path: Path) -> None:
    report = Report()
    expected = report.steps([0, 1, 2, 3])  # odd steps use StringIds via textId
    assert report.strings
    path = report.write(tmp_path / "r.sqlite")
    np.testing.assert_allclose(reduce_nsys(path).d[:, 0], expected * 1e-9, rtol=0, atol=1e-15)


def test_without_the_enum_table_the_published_ids_are_used(tmp_path: Path) -> None:
    report = Report()
    expected = report.steps([0, 1, 2])
    path = report.write(tmp_path / "r.sqlite", enum=False)
    np.testing.assert_allclose(reduce_nsys(path).d[:, 0], expected * 1e-9, rtol=0, atol=1e-15)


def test_start_end_ranges_count_marks_and_other_threads_do_not(tmp_path: Path) -> None:
    report = Report(pid=7, tid=7)
    expected = report.steps([0, 1])
    step0 = 1_000 * MS
    # a start/end (eventType 60) range of a stage, inside step 0: summed with the push/pop one
    report.range(CB, step0 + 30 * MS, step0 + 31 * MS, event_type=START_END)
    # a mark and a domain-create row that happen to carry a stage name: not ranges
    report.range(FWD, step0 + 1 * MS, step0 + 9 * MS, event_type=MARK)
    report.range(FWD, step0 + 1 * MS, step0 + 9 * MS, event_type=DOMAIN_CREATE)
    # the same stage on another thread of the process: ignored
    report.range(BWD, step0, step0 + 40 * MS, gtid=global_tid(7, 8))
    # a range still open when capture stopped
    report.range(OPT, step0 + 50 * MS, None)
    reduced = reduce_nsys(report.write(tmp_path / "r.sqlite"))
    expected[0, 3] += 1 * MS
    expected[0, 5] -= 1 * MS
    np.testing.assert_allclose(reduced.d[:, 0], expected * 1e-9, rtol=0, atol=1e-15)
    notes = " | ".join(reduced.notes)
    assert "1 NVTX range(s) without an end skipped" in notes
    assert "1 stage range(s) on threads other than the training thread" in notes
    assert "several ranges within one step in 1 (step, stage) cell(s)" in notes


def test_overlapping_ranges_give_overlap_error_not_negative_residual(tmp_path: Path) -> None:
    report = Report()
    report.steps([0])
    step0 = 1_000 * MS
    # a second data range late in the step, running 20 ms past its end (wall: 40 ms)
    report.range(DATA, step0 + 39_600_000, step0 + 60 * MS, event_type=START_END)
    reduced = reduce_nsys(report.write(tmp_path / "r.sqlite"))
    timed = reduced.d[0, 0, :-1].sum()
    wall = (sum(STAGE_MS) + 2) * 1e-3
    assert reduced.d[0, 0, -1] == 0.0
    assert reduced.overlap_error_s == pytest.approx(timed - wall, abs=1e-12)
    assert any("1 stage range(s) run past their step's end" in n for n in reduced.notes)
    assert "overlap error" in " ".join(reduced.analyze().reasons.get("telemetry_limited", []))


def test_rank_from_trailing_number_and_mapping(tmp_path: Path) -> None:
    expected = two_ranks(tmp_path / "q", names="report_{}.sqlite")  # -o report_%q{RANK}
    np.testing.assert_allclose(reduce_nsys(tmp_path / "q").d, expected, rtol=0, atol=1e-15)
    renamed = tmp_path / "named"
    renamed.mkdir()
    for rank in (0, 1):
        (tmp_path / "q" / f"report_{rank}.sqlite").rename(renamed / f"node-{'ab'[rank]}.sqlite")
    with pytest.raises(TraceFormatError, match="cannot tell its rank"):
        reduce_nsys(renamed)
    reduced = reduce_nsys(renamed, ranks={"node-a.sqlite": 0, "node-b.sqlite": 1})
    np.testing.assert_allclose(reduced.d, expected, rtol=0, atol=1e-15)


def test_one_report_holding_every_rank_needs_process_ranks(tmp_path: Path) -> None:
    report = Report()
    expected = []
    for rank, pid in enumerate((300, 200)):
        report.gtid = global_tid(pid, pid)
        expected.append(report.steps([0, 1, 2], extra_ms={FWD: 30.0} if rank == 1 else None))
    path = report.write(tmp_path / "all.sqlite")
    with pytest.raises(TraceFormatError, match="step ranges from 2 processes"):
        reduce_nsys(path)
    with pytest.raises(TraceFormatError, match=r"no rank for process\(es\) \[300\]"):
        reduce_nsys(path, process_ranks={200: 1})
    reduced = reduce_nsys(path, process_ranks={300: 0, 200: 1})
    np.testing.assert_allclose(reduced.d, np.stack(expected, axis=1) * 1e-9, rtol=0, atol=1e-15)
    assert reduced.analyze().top1 == FWD


def test_world_size_detects_missing_ranks(tmp_path: Path) -> None:
    two_ranks(tmp_path)
    with pytest.raises(MissingRanksError, match=r"rank\(s\) 2-3 of world size 4"):
        reduce_nsys(tmp_path, world_size=4)
    reduced = reduce_nsys(tmp_path, world_size=4, missing_ranks="allow")
    assert reduced.missing_ranks == (2, 3)
    assert "telemetry_limited" in reduced.analyze().labels


def test_misaligned_steps(tmp_path: Path) -> None:
    for rank, ids in enumerate(([0, 1, 2, 3], [1, 2, 3, 4])):
        report = Report(pid=10 + rank, tid=10 + rank)
        report.steps(ids)
        report.write(tmp_path / f"report_rank{rank}.sqlite")
    reduced = reduce_nsys(tmp_path)
    assert reduced.step_ids == (1, 2, 3)
    assert any("step(s) 0 dropped" in n for n in reduced.notes)
    assert any("step(s) 4 dropped" in n for n in reduced.notes)
    with pytest.raises(MisalignedStepsError):
        reduce_nsys(tmp_path, align="strict")


def test_missing_stage_lists_the_names_seen(tmp_path: Path) -> None:
    report = Report()
    report.steps([0, 1])
    path = report.write(tmp_path / "r.sqlite")
    with pytest.raises(MissingStagesError, match=r"no range for stage\(s\) extra\.stage") as err:
        reduce_nsys(path, [*TIMED, "extra.stage"])
    assert "r.sqlite" in str(err.value)


def test_profiler_step_ranges_are_preferred(tmp_path: Path) -> None:
    report = Report()
    expected = report.steps([5, 6], step_name="ProfilerStep#{}")
    reduced = reduce_nsys(report.write(tmp_path / "r.sqlite"))
    assert reduced.step_ids == (5, 6) and reduced.meta["step_kind"] == "profiler"
    np.testing.assert_allclose(reduced.d[:, 0], expected * 1e-9, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("text", "not an SQLite database"),
        ("empty", "no NVTX_EVENTS table"),
        ("columns", "NVTX_EVENTS lacks column"),
        ("nosteps", "no step ranges"),
    ],
)
def test_bad_exports_name_themselves(tmp_path: Path, setup: str, needle: str) -> None:
    path = tmp_path / "bad.sqlite"
    if setup == "text":
        path.write_text("not a database")
    else:
        with closing(sqlite3.connect(path)) as db:
            if setup == "empty":
                db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
            elif setup == "columns":
                db.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, text TEXT)")
            else:
                db.executescript(SCHEMA)
            db.commit()
    with pytest.raises(TraceFormatError, match=needle) as err:
        reduce_nsys(path)
    assert str(path) in str(err.value)


def test_cli_auto_detects_nsys_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two_ranks(tmp_path)
    assert detect_format(tmp_path) == "nsys"
    assert detect_format(tmp_path / "report_rank0.sqlite") == "nsys"
    code = main(["analyze", str(tmp_path / "report_rank0.sqlite")])
    out, _ = capsys.readouterr()
    assert code == 0 and "source=nsys" in out
    code = main(["analyze", str(tmp_path), "--format", "nsys", "--steps", "11:13"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert f"top-1: {DATA}" in out and "steps=11-13 (3)" in out
