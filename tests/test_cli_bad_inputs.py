"""Inputs that used to crash the command line with a traceback: each now gets one line and exit
code 2 (or, where the input is usable, a note about what was skipped); ``report`` and ``plot``
validate ``windows.jsonl``, name a corrupt packet, and report each stage list of a run apart."""

from __future__ import annotations

import io
import json
import logging
import math
import sqlite3
import time
import zipfile
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.cli import main
from stagefrontier.sinks import PacketSink
from test_reducers_nsys import Report
from trace_support import load_events, write_events
from trace_support import trace as committed_trace

STEP_PREFIX = "ProfilerStep#"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("stagefrontier: error: "), err
    assert needle in err, err


@pytest.fixture(scope="module")
def trace() -> Path:
    return committed_trace("single-4-steps.json")


def edited_trace(trace: Path, path: Path, edit: Any) -> Path:
    """A copy of the real trace with ``edit(events)`` applied."""
    header, events = load_events(trace)
    edit(events)
    return write_events(path, header, events)


def first(events: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(e for e in events if e.get("ph") == "X" and str(e.get("name")).startswith(prefix))


# --- traces ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("dur", 1e308, "ts/dur out of range: 1"), ("ts", math.nan, "non-finite ts/dur: 1")],
)
@pytest.mark.parametrize("fmt", ["kineto", "hta"])
def test_absurd_range_times_are_skipped_with_a_note(
    trace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    field: str,
    value: float,
    reason: str,
) -> None:
    if fmt == "hta":
        pytest.importorskip("hta")
    path = edited_trace(
        trace, tmp_path / "t.json", lambda ev: first(ev, STEP_PREFIX).update({field: value})
    )
    code, out, err = run(["analyze", str(path), "--format", fmt], capsys)
    assert code == 0, err
    assert "steps=2-4 (3)" in out  # the first step range, the one edited, is dropped
    if fmt == "kineto" or field == "dur":  # HTA drops a NaN start itself, before the reducer
        assert f"1 range(s) ({reason}) skipped: malformed ts/dur" in out


def test_every_step_range_malformed_says_so(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def negative(events: list[dict[str, Any]]) -> None:
        for event in events:
            if str(event.get("name")).startswith(STEP_PREFIX):
                event["dur"] = -event["dur"]

    path = edited_trace(trace, tmp_path / "neg.json", negative)
    code, out, err = run(["analyze", str(path)], capsys)
    assert_one_line_error(code, out, err, "no usable step range")
    assert "negative dur" in err and "no step ranges" not in err


def test_json_list_of_numbers_is_not_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    code, out, err = run(["analyze", str(path)], capsys)
    assert_one_line_error(code, out, err, "event 0 is a JSON number, not an event object")


@pytest.mark.parametrize("fmt", ["auto", "packet"])
def test_deeply_nested_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, out, err = run(["analyze", str(path), "--format", fmt], capsys)
    assert_one_line_error(code, out, err, str(path))


def test_nsight_non_integer_global_tid_is_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = Report()
    report.steps(range(4))
    report.range("model.backward_cpu_wall", 5, 9, gtid=None)
    start, end, kind, text, _, text_id = report.rows[-1]
    report.rows[-1] = (start, end, kind, text, "main-thread", text_id)  # type: ignore[assignment]
    path = report.write(tmp_path / "report_rank0.sqlite")
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT typeof(globalTid) FROM NVTX_EVENTS").fetchall()[-1] == ("text",)
    code, out, err = run(["analyze", str(path)], capsys)
    assert code == 0, err
    assert "1 NVTX range(s) with a globalTid that is not an integer skipped" in out


# --- packets and .npz ----------------------------------------------------------------------------


def run_folder(out: Path, factors: tuple[int, ...] = (1,), steps: int = 6) -> Path:
    """A real single-process run writing windows.jsonl and packets, ``steps`` optimizer steps
    per accumulation factor in ``factors`` (a change of factor closes the window)."""
    timer = StageTimer(
        config=TimerConfig(
            window=3, collection=CollectConfig(out_dir=out, sinks=[PacketSink(out)], log=False)
        )
    )
    for factor in factors:
        for _ in range(steps):
            with timer.step():
                for i in range(factor):
                    with timer.microstep(i) if factor > 1 else _nothing():
                        with timer.stage("data.next_wait"):
                            time.sleep(0.0002)
                        with timer.stage("model.fwd_loss_cpu_wall"):
                            time.sleep(0.0005)
                        with timer.stage("model.backward_cpu_wall"):
                            time.sleep(0.001)
                with timer.stage("optim.step_cpu_wall"):
                    time.sleep(0.0002)
    timer.close()
    return out


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_folder(tmp_path_factory.mktemp("run"))


def a_packet(folder: Path) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(next((folder / "packets").glob("*.json")).read_text())
    return obj


@pytest.mark.parametrize(
    ("gates", "needle"),
    [
        (None, "packet field 'gates' must be a JSON object"),
        ("strict", "packet field 'gates' must be a JSON object"),
        ("every", "packet field 'gates' is invalid"),
    ],
)
def test_packet_gates_null_or_strings(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], gates: Any, needle: str
) -> None:
    for where in ("packet", "report"):
        obj = a_packet(folder)
        held = obj if where == "packet" else obj["report"]
        held["gates"] = {k: "x" for k in held["gates"]} if gates == "every" else gates
        path = tmp_path / "p.json"
        path.write_text(json.dumps(obj))
        code, out, err = run(["analyze", str(path)], capsys)
        assert_one_line_error(code, out, err, needle if where == "packet" else "malformed report")


def test_npz_declaring_a_huge_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = io.BytesIO()
    shape = (10**10, 1, 6)  # 480 GB declared, 96 bytes held
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    stages = io.BytesIO()
    np.save(stages, np.array(list(sf.DEFAULT_STAGES)))
    path = tmp_path / "w.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("d.npy", header.getvalue() + bytes(96))
        archive.writestr("stages.npy", stages.getvalue())
    code, out, err = run(["analyze", str(path)], capsys)
    assert_one_line_error(code, out, err, f"{path}: d.npy declares shape [10000000000, 1, 6]")


def test_plot_refuses_an_output_that_is_not_png(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plot", str(folder), "-o", str(folder / "x.txt")], capsys)
    assert_one_line_error(code, out, err, "name one *.png")


# --- windows.jsonl and packets in report / plot --------------------------------------------------


def records_folder(tmp_path: Path, folder: Path, content: bytes) -> Path:
    """An output folder holding only ``windows.jsonl``: the real first record, then ``content``."""
    out = tmp_path / "records"
    out.mkdir()
    first_line = (folder / "windows.jsonl").read_bytes().splitlines(keepends=True)[0]
    (out / "windows.jsonl").write_bytes(first_line + content)
    return out


def record_with(folder: Path, **changes: Any) -> bytes:
    record = json.loads((folder / "windows.jsonl").read_bytes().splitlines()[0])
    record.update(changes)
    return json.dumps(record).encode() + b"\n"


@pytest.mark.parametrize("command", ["report", "report --html", "plot"])
@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b"{}\n", "windows.jsonl:2: not a window record (no 'window' index)"),
        (b"[1, 2]\n", "windows.jsonl:2: not a window record"),
        ("n_steps", "a report of 0 step(s)"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe\n", "windows.jsonl:2: not JSON"),
        ("attempt", "window facts: Expected `int`, got `str` - at `$.attempt`"),
        (b'{"window": 1, "' + b"[" * 50_000 + b"\n", "windows.jsonl:2: not JSON"),
    ],
)
def test_bad_records_are_one_line(
    folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    line: Any,
    needle: str,
) -> None:
    if line == "n_steps":
        line = record_with(folder, n_steps=0, window=1)
    elif line == "attempt":
        line = record_with(folder, attempt="1", window=1)
    out_dir = records_folder(tmp_path, folder, line)
    name, *options = command.split()
    code, out, err = run([name, str(out_dir), *options], capsys)
    assert_one_line_error(code, out, err, needle)


def test_truncated_last_record_is_skipped_with_a_warning(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: Any
) -> None:
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "packets").symlink_to(folder / "packets")
    text = (folder / "windows.jsonl").read_bytes()
    (out_dir / "windows.jsonl").write_bytes(text + text.splitlines()[0][:40])
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        code, out, err = run(["report", str(out_dir)], capsys)
    assert code == 0, err
    assert "windows.jsonl:3: last line is cut short" in caplog.text
    assert "2 window(s)" in out


def test_one_corrupt_packet_is_named(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "run"
    (out_dir / "packets").mkdir(parents=True)
    for packet in (folder / "packets").glob("*.json"):
        (out_dir / "packets" / packet.name).write_bytes(packet.read_bytes())
    bad = out_dir / "packets" / "window-000001.json"
    bad.write_bytes(bad.read_bytes()[:-10])
    code, out, err = run(["report", str(out_dir)], capsys)
    assert_one_line_error(code, out, err, f"{bad}: packet is not JSON")


def test_accumulation_change_mid_run_reports_and_plots_each_stage_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = run_folder(tmp_path / "run", factors=(1, 3))
    counts = {len(json.loads(p.read_text())["stages"]) for p in out_dir.glob("packets/*.json")}
    assert counts == {6, 16}
    code, out, err = run(["report", str(out_dir)], capsys)
    assert code == 0, err
    assert "holds windows of 2 stage lists" in out
    assert "=== Stage list 1 of 2: 6 stages ===" in out
    assert "=== Stage list 2 of 2: 16 stages ===" in out
    pytest.importorskip("matplotlib")
    code, out, err = run(["plot", str(out_dir)], capsys)
    assert code == 0, err
    written = sorted(p.name for p in out_dir.glob("*.png"))
    assert written == [
        "frontier_worst_step_stages1.png",
        "frontier_worst_step_stages2.png",
        "shares_over_time_stages1.png",
        "shares_over_time_stages2.png",
    ]


# --- the last resort -----------------------------------------------------------------------------


def test_unexpected_error_is_one_line_with_a_traceback_file(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import stagefrontier.formats.run_folder as run_folder_module

    def broken(_: Path) -> None:
        return {}["a key no reader checks"]  # type: ignore[no-any-return]

    monkeypatch.setattr(run_folder_module, "load_run", broken)
    code, out, err = run(["report", str(folder)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("stagefrontier: error: unexpected KeyError: ")
    traceback_file = Path(err.rsplit(" ", 1)[1].rstrip(")\n"))
    assert "def broken" not in err and "broken" in traceback_file.read_text()
    traceback_file.unlink()
