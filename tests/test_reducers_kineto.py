"""PyTorch Profiler traces reduced to the stage matrix: real traces produced here, checked against
an independent event-by-event reading, the residual rule, the analyzer, and every refusal."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier.cli import main
from stagefrontier.errors import ReportFormatError
from stagefrontier.reducers import (
    MisalignedStepsError,
    MissingRanksError,
    MissingStagesError,
    TraceFormatError,
    kineto,
    reduce_kineto,
)
from stagefrontier.reducers.detect import detect_format
from trace_support import (
    DATA,
    DATA_SLEEP_S,
    FWD,
    SLOW_RANK,
    STAGES,
    TIMED,
    WORLD,
    load_events,
    reference_matrix,
    trace,
    write_events,
)

NS = 1e-9


def rank_files(folder: Path) -> dict[int, Path]:
    out = {}
    for path in folder.glob("*.pt.trace.json"):
        header, _ = load_events(path)
        out[header["distributedInfo"]["rank"]] = path
    return out


def expected(files: dict[int, Path]) -> tuple[list[int], np.ndarray]:
    refs = {rank: reference_matrix(path) for rank, path in files.items()}
    ids = sorted(set.intersection(*(set(r) for r in refs.values())))
    d = np.stack([np.stack([refs[r][i] for i in ids]) for r in sorted(refs)], axis=1)
    return ids, d * NS


# --- a real 2-rank Gloo job ---------------------------------------------------------------------


def test_gloo_traces_reduce_to_the_range_durations(gloo_dir: Path) -> None:
    reduced = reduce_kineto(gloo_dir)
    ids, d = expected(rank_files(gloo_dir))
    assert reduced.ranks == (0, 1) and reduced.world_size == WORLD
    assert reduced.stages == STAGES
    assert list(reduced.step_ids) == ids and len(ids) == 5
    assert reduced.d.shape == (5, WORLD, len(STAGES)) and reduced.d.dtype == np.float64
    np.testing.assert_array_equal(reduced.d, d)
    assert reduced.meta["step_kind"] == "profiler"
    assert reduced.meta["time_base"] == "baseTimeNanoseconds"
    assert reduced.missing_ranks == () and reduced.overlap_error_s == 0.0
    # the injected sleep sits inside the slow rank's data ranges
    assert (reduced.d[:, SLOW_RANK, 0] >= DATA_SLEEP_S).all()


def test_residual_rule_closes_every_step(gloo_dir: Path) -> None:
    reduced = reduce_kineto(gloo_dir)
    for rank, path in rank_files(gloo_dir).items():
        _, events = load_events(path)
        walls = {
            int(e["name"].split("#")[1]): round(e["dur"] * 1000)
            for e in events
            if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")
        }
        column = reduced.ranks.index(rank)
        for row, step_id in enumerate(reduced.step_ids):
            timed = reduced.d[row, column, :-1].sum()
            wall = walls[step_id] * NS
            assert reduced.d[row, column, -1] == pytest.approx(max(wall - timed, 0.0), abs=1e-12)
            assert reduced.overlap_s[row, column] == pytest.approx(
                max(timed - wall, 0.0), abs=1e-12
            )


def test_injected_sleep_is_the_top_stage_led_by_its_rank(gloo_dir: Path) -> None:
    report = reduce_kineto(gloo_dir).analyze()
    assert report.top1 == DATA
    assert report.leaders[DATA] == SLOW_RANK
    assert DATA in report.routing_set


def test_files_given_one_by_one_equal_the_folder(gloo_dir: Path) -> None:
    files = sorted(gloo_dir.glob("*.json"))
    np.testing.assert_array_equal(reduce_kineto(files).d, reduce_kineto(gloo_dir).d)


def test_gzip_and_absolute_timestamps_give_the_same_matrix(gloo_dir: Path, tmp_path: Path) -> None:
    reference = reduce_kineto(gloo_dir)
    for rank, path in rank_files(gloo_dir).items():
        header, events = load_events(path)
        # an old-style trace: absolute microsecond timestamps and no baseTimeNanoseconds
        base_us = header.pop("baseTimeNanoseconds") / 1000
        for event in events:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] = event["ts"] + base_us
        text = json.dumps({**header, "traceEvents": events}).encode()
        (tmp_path / f"rank{rank}.json.gz").write_bytes(gzip.compress(text))
    reduced = reduce_kineto(tmp_path)
    assert reduced.meta["time_base"] == "absolute"
    assert reduced.step_ids == reference.step_ids
    np.testing.assert_allclose(reduced.d, reference.d, rtol=0, atol=2e-9)


# --- single process: explicit ranks, step annotations, threads ---------------------------------


def test_single_file_without_distributed_info_is_rank_zero(single: Path) -> None:
    reduced = reduce_kineto(single)
    ref = reference_matrix(single)
    assert reduced.ranks == (0,) and reduced.world_size is None
    np.testing.assert_array_equal(reduced.d[:, 0, :], np.stack([ref[i] for i in sorted(ref)]) * NS)
    # A fact about the input, not a telemetry problem: not a telemetry_limited reason.
    assert reduced.meta["rank"].startswith("0 (the only file") and not reduced.notes
    limited = reduced.analyze().reasons.get("telemetry_limited", [])
    assert not any("rank" in reason for reason in limited), limited


def test_explicit_rank_mapping(single: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    shutil.copy(single, other)
    reduced = reduce_kineto([single, other], ranks={str(single): 0, "other.json": 1})
    assert reduced.ranks == (0, 1)
    np.testing.assert_array_equal(reduced.d[:, 0], reduced.d[:, 1])
    with pytest.raises(TraceFormatError, match="cannot tell its rank"):
        reduce_kineto([single, other])
    with pytest.raises(TraceFormatError, match="not a trace file given"):
        reduce_kineto(single, ranks={"typo.json": 0})


def test_mapping_overrides_distributed_info_with_a_note(gloo_dir: Path) -> None:
    files = rank_files(gloo_dir)
    reduced = reduce_kineto(gloo_dir, ranks={files[0].name: 1, files[1].name: 0})
    assert any("the rank mapping says 1, distributedInfo says 0" in n for n in reduced.notes)
    np.testing.assert_array_equal(reduced.d[:, 1], reduce_kineto(gloo_dir).d[:, 0])


def test_numbered_step_annotation(tmp_path: Path) -> None:
    path = trace("numbered-steps-3.json")
    reduced = reduce_kineto(path)
    assert reduced.meta["step_kind"] == "annotation"
    assert reduced.step_ids == (0, 1, 2) and not reduced.meta["ordinal_step_ids"]
    _, events = load_events(path)
    walls = sorted(
        (e["name"], round(e["dur"] * 1000))
        for e in events
        if e.get("ph") == "X" and e["name"].startswith("stagefrontier.step#")
    )
    totals = reduced.d.sum(axis=2)[:, 0] - reduced.overlap_s[:, 0]
    np.testing.assert_allclose(totals, [w * NS for _, w in walls], rtol=0, atol=1e-12)


def test_bare_step_annotation_numbers_steps_in_order(tmp_path: Path) -> None:
    path = trace("bare-steps-3.json")
    with pytest.raises(TraceFormatError, match="no step ranges"):
        reduce_kineto(path)
    reduced = reduce_kineto(path, step_name="my.step")
    assert reduced.step_ids == (0, 1, 2) and reduced.meta["ordinal_step_ids"]
    assert any("carry no step number" in note for note in reduced.notes)


def test_step_source_profiler_refuses_annotation_only_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = trace("numbered-steps-3.json")
    with pytest.raises(TraceFormatError, match=r"no step ranges \(ProfilerStep#N\)"):
        reduce_kineto(path, step_source="profiler")
    assert main(["analyze", str(path), "--step-source", "profiler"]) == 2
    assert "no step ranges (ProfilerStep#N)" in capsys.readouterr().err
    assert main(["analyze", str(path), "--step-source", "annotation"]) == 0


def test_stage_ranges_on_another_thread_are_ignored(single: Path, tmp_path: Path) -> None:
    # A stage-named range on a helper thread (a data-loader or hook thread), overlapping the
    # steps in time, must not count: copy every forward range onto another thread.
    header, events = load_events(single)
    copies = [{**e, "tid": 999_999} for e in events if e.get("ph") == "X" and e.get("name") == FWD]
    path = write_events(tmp_path / "t.json", header, events + copies)
    reduced = reduce_kineto(path)
    np.testing.assert_array_equal(reduced.d, reduce_kineto(single).d)
    assert any(
        f"{len(copies)} stage range(s) on threads other than the training thread" in note
        for note in reduced.notes
    )


def test_several_files_of_one_rank_are_joined(gloo_dir: Path, tmp_path: Path) -> None:
    # split rank 0's trace into two "profiler cycles": its first two steps and the rest
    files = rank_files(gloo_dir)
    header, events = load_events(files[0])
    steps = sorted(
        (e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")),
        key=lambda e: e["ts"],
    )
    cut = steps[2]["ts"]
    is_timed = [isinstance(e.get("ts"), (int, float)) for e in events]
    early = [e for e, t in zip(events, is_timed, strict=True) if not t or e["ts"] < cut]
    late = [e for e, t in zip(events, is_timed, strict=True) if not t or e["ts"] >= cut]
    write_events(tmp_path / "a.json", header, early)
    write_events(tmp_path / "b.json", header, late)
    shutil.copy(files[1], tmp_path / "r1.json")
    reduced = reduce_kineto(tmp_path)
    np.testing.assert_array_equal(reduced.d, reduce_kineto(gloo_dir).d)
    assert reduced.files[0] == (str(tmp_path / "a.json"), str(tmp_path / "b.json"))


# --- refusals and downgrades ----------------------------------------------------------------------


def test_missing_rank_is_refused_or_allowed_and_downgraded(gloo_dir: Path) -> None:
    rank0 = rank_files(gloo_dir)[0]
    with pytest.raises(MissingRanksError, match=r"rank\(s\) 1 of world size 2") as err:
        reduce_kineto(rank0)
    assert rank0.name in str(err.value)
    reduced = reduce_kineto(rank0, missing_ranks="allow")
    assert reduced.ranks == (0,) and reduced.missing_ranks == (1,)
    report = reduced.analyze()
    assert "telemetry_limited" in report.labels
    assert any("missing ranks [1]" in r for r in report.reasons["telemetry_limited"])


def test_misaligned_steps_intersect_or_strict(gloo_dir: Path, tmp_path: Path) -> None:
    files = rank_files(gloo_dir)
    header, events = load_events(files[1])
    first = min(
        int(e["name"].split("#")[1])
        for e in events
        if str(e.get("name")).startswith("ProfilerStep#")
    )
    events = [e for e in events if e.get("name") != f"ProfilerStep#{first}"]
    write_events(tmp_path / "r1.json", header, events)
    shutil.copy(files[0], tmp_path / "r0.json")
    full = reduce_kineto(gloo_dir)
    reduced = reduce_kineto(tmp_path)
    assert reduced.step_ids == full.step_ids[1:]
    np.testing.assert_array_equal(reduced.d, full.d[1:])
    assert any(f"step(s) {first} dropped" in note for note in reduced.notes)
    with pytest.raises(MisalignedStepsError, match="different step ids"):
        reduce_kineto(tmp_path, align="strict")


def test_no_common_step_is_refused(gloo_dir: Path, tmp_path: Path) -> None:
    files = rank_files(gloo_dir)
    header, events = load_events(files[1])
    for event in events:
        if str(event.get("name")).startswith("ProfilerStep#"):
            event["name"] = f"ProfilerStep#{int(event['name'].split('#')[1]) + 100}"
    write_events(tmp_path / "r1.json", header, events)
    shutil.copy(files[0], tmp_path / "r0.json")
    with pytest.raises(MisalignedStepsError, match="no step id is common"):
        reduce_kineto(tmp_path)


def test_missing_stage_is_refused_with_the_names_seen(single: Path) -> None:
    stages = [*TIMED, "extra.cpu_wall"]
    with pytest.raises(MissingStagesError, match=r"extra\.cpu_wall") as err:
        reduce_kineto(single, stages)
    message = str(err.value)
    assert str(single) in message and "Optimizer.step#SGD.step" in message
    reduced = reduce_kineto(single, stages, missing_stages="zero")
    assert (reduced.d[:, :, stages.index("extra.cpu_wall")] == 0).all()
    assert any("no range for stage(s) extra.cpu_wall" in note for note in reduced.notes)


def test_custom_stage_subset(single: Path) -> None:
    reduced = reduce_kineto(single, [DATA, FWD])
    full = reduce_kineto(single)
    np.testing.assert_array_equal(reduced.d[:, :, :2], full.d[:, :, :2])
    np.testing.assert_allclose(reduced.d.sum(axis=2), full.d.sum(axis=2), rtol=1e-12)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"traceEvents": 3}', "no traceEvents list"),
        (b'{"traceEvents": [', "not a readable JSON trace"),
        (gzip.compress(b'{"traceEvents": [', mtime=0)[:-6], "not a readable JSON trace"),
        (b'{"traceEvents": []}', "no step ranges"),
    ],
)
def test_bad_files_name_themselves(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=needle) as err:
        reduce_kineto(path)
    assert str(path) in str(err.value)
    assert isinstance(err.value, ReportFormatError)


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        reduce_kineto(tmp_path / "nope.json")
    with pytest.raises(TraceFormatError, match="folder holds no PyTorch Profiler trace"):
        reduce_kineto(tmp_path)


def test_repeated_step_id_is_refused(single: Path, tmp_path: Path) -> None:
    header, events = load_events(single)
    steps = [e for e in events if str(e.get("name")).startswith("ProfilerStep#")]
    steps[1]["name"] = steps[0]["name"]
    path = write_events(tmp_path / "t.json", header, events)
    with pytest.raises(TraceFormatError, match="appear more than once"):
        reduce_kineto(path)


def test_select_steps(gloo_dir: Path) -> None:
    reduced = reduce_kineto(gloo_dir)
    inner = reduced.select_steps(reduced.step_ids[1:4])
    np.testing.assert_array_equal(inner.d, reduced.d[1:4])
    assert inner.step_ids == reduced.step_ids[1:4]
    with pytest.raises(MisalignedStepsError, match="not in the reduced trace"):
        reduced.select_steps([10_000])


# --- the command line -----------------------------------------------------------------------------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_analyzes_a_trace_folder(gloo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["analyze", str(gloo_dir)], capsys)
    assert code == 0 and err == ""
    assert f"top-1: {DATA}" in out
    assert "source=kineto" in out and "world_size=2" in out


def test_cli_json_steps_and_format(gloo_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = reduce_kineto(gloo_dir).step_ids
    argv = ["analyze", str(gloo_dir), "--format", "kineto", "--json"]
    code, out, _ = run([*argv, "--steps", f"{ids[1]}:{ids[3]}"], capsys)
    report: dict[str, Any] = json.loads(out)
    assert code == 0 and report["n_steps"] == 3 and report["top1"] == DATA


def test_cli_rank_option_and_missing_ranks(
    gloo_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rank0 = rank_files(gloo_dir)[0]
    code, _, err = run(["analyze", str(rank0)], capsys)
    assert code == 2 and "rank(s) 1 of world size 2 have no trace" in err
    code, out, _ = run(["analyze", str(rank0), "--allow-missing-ranks"], capsys)
    assert code == 0 and "telemetry_limited" in out and "trace notes:" in out
    code, _, err = run(["analyze", str(rank0), "--rank", "oops"], capsys)
    assert code == 2 and "expected FILE=RANK" in err


def test_cli_stages_option(single: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["analyze", str(single), "--stages", f"{DATA},{FWD}", "--json"], capsys)
    assert code == 0 and json.loads(out)["stages"] == [DATA, FWD, "step.other_cpu_wall"]


def test_detect_format(gloo_dir: Path, single: Path, tmp_path: Path) -> None:
    assert detect_format(gloo_dir) == "kineto"
    assert detect_format(single) == "kineto"
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(single.read_bytes()))
    assert detect_format(gz) == "kineto"
    np.savez(tmp_path / "w.npz", d=np.zeros((1, 1, 1)))
    assert detect_format(tmp_path / "w.npz") == "npz"
    (tmp_path / "p.json").write_text('{"format":"stagefrontier.formats.packet","version":1}')
    assert detect_format(tmp_path / "p.json") == "packet"
    rep = tmp_path / "report.nsys-rep"
    rep.write_bytes(b"\x00binary")
    with pytest.raises(TraceFormatError, match="nsys export --type sqlite"):
        detect_format(rep)


# --- events cut to the range fields (the router's reduction) ------------------------------------


def _cut(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: e[k] for k in kineto.RANGE_FIELDS if e.get(k) is not None} for e in events]


def test_trace_ranges_hold_the_range_fields_of_every_event(
    single: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgspec's decoding keeps every event with exactly its range fields, values and types, and
    the header."""
    zipped = tmp_path / "trace.json.gz"
    zipped.write_bytes(gzip.compress(single.read_bytes()))
    for path in (single, zipped):
        header, events = kineto.load_trace(path)
        cut_header, cut = kineto.load_trace_ranges(path)
        assert cut_header == header and "traceName" in header  # a key after the events too
        assert cut == _cut(events) and len(cut) > 100
        assert [[type(v) for v in e.values()] for e in cut] == [
            [type(v) for v in e.values()] for e in _cut(events)
        ]
        assert any("args" in e for e in events) and not any("args" in e for e in cut)


@pytest.mark.parametrize(
    "content",
    [
        b'[{"ph": "X", "name": "a", "ts": 1, "dur": 2}]',  # the bare array format
        b'{"traceEvents": [{"ph": "X", "ts": NaN, "dur": Infinity}]}',  # the stdlib reads these
        b'{"traceEvents": [{"ph": "X", "ts": 1e400, "dur": 1}], "rank": 2}',  # out of range
        b'{"traceEvents": [{"ph": "X"}, 7]}',  # an event that is not an object
        b'{"traceEvents": 3}',
        b'{"events": []}',
        b'{"traceEvents": [',
        # nested past msgspec's depth: it raised a bare RecursionError (issue 37 item 10)
        b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
    ids=lambda content: f"{content[:40]!r}",
)
def test_trace_ranges_fall_back_to_the_standard_library_where_msgspec_does_not_read_the_file(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    try:
        expected: Any = kineto.load_trace(path)
    except TraceFormatError as exc:
        with pytest.raises(TraceFormatError) as err:
            kineto.load_trace_ranges(path)
        assert str(err.value) == str(exc)
    else:
        assert kineto.load_trace_ranges(path) == expected
