"""Fuzzing every reader: real inputs (a packet and a ``windows.jsonl`` of a real run, a real
window payload, a real profiler trace, an Nsight-schema export, an ``.npz``) are mutated by
hypothesis, at the JSON level (any value replaced, removed or added anywhere) and at the byte
level. Every input must either be read (and analyzed) or raise a StageFrontierError: never
another exception.

The example count per test is ``STAGEFRONTIER_FUZZ_EXAMPLES`` (default 60: the whole file runs
in well under a minute); benchmarks/results/fuzz.md records a longer run.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import sqlite3
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stagefrontier as sf
from recorder_support import CaptureCollector
from stagefrontier import CollectConfig, SamplingConfig, StageTimer, TimerConfig
from stagefrontier.collect.wire import decode_window, encode_window
from stagefrontier.formats.packet import packet_from_bytes
from stagefrontier.formats.records import read_records
from stagefrontier.formats.run_folder import load_run
from stagefrontier.load import load_window
from stagefrontier.render.text import run_report_text, window_report_text
from stagefrontier.sinks import PacketSink
from test_reducers_nsys import ENUM, SCHEMA, Report
from trace_support import load_events, trace

EXAMPLES = int(os.environ.get("STAGEFRONTIER_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=EXAMPLES <= 60,  # CI runs a fixed set of examples: a flaky test is a failing one
)

# --- mutations ------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, math.nan, math.inf]),
    st.text(max_size=12),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (keys and indices) into a JSON tree, the root first."""
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:50]):  # the first items of long lists suffice
            yield from _paths(value, (*prefix, i))


def mutate_json(data: st.DataObject, obj: Any, rounds: int = 3) -> Any:
    """A copy of ``obj`` with up to ``rounds`` of: a value replaced by any JSON value, a key
    removed, a key added, a list item duplicated or dropped."""
    obj = copy.deepcopy(obj)
    for _ in range(data.draw(st.integers(1, rounds))):
        paths = list(_paths(obj))
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "remove", "add", "duplicate"]))
        if not path:
            obj = data.draw(JSON) if action == "replace" else obj
            continue
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if action == "replace":
            parent[last] = data.draw(JSON)
        elif action == "remove":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON)
        elif isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
    return obj


def mutate_bytes(data: st.DataObject, raw: bytes) -> bytes:
    """``raw`` with a few bytes flipped, inserted or deleted, or cut short."""
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        if not out:
            break
        at = data.draw(st.integers(0, len(out) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if action == "flip":
            out[at] = data.draw(st.integers(0, 255))
        elif action == "insert":
            out[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del out[at : at + data.draw(st.integers(1, 8))]
        else:
            del out[at:]
    return bytes(out)


def reads_or_refuses(read: Callable[[], Any]) -> None:
    """The property: ``read()`` returns, or raises a StageFrontierError."""
    with suppress(sf.StageFrontierError):
        read()


@contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sf-fuzz-") as folder:
        yield Path(folder)


# --- real inputs ----------------------------------------------------------------------------------


def timed_steps(timer: StageTimer, steps: int) -> None:
    for i in range(steps):
        with timer.step():
            with timer.stage("data.next_wait"):
                time.sleep(0.0002 * (1 + i % 3))
            with timer.stage("model.backward_cpu_wall"):
                time.sleep(0.0005)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    timer = StageTimer(
        config=TimerConfig(
            window=4, collection=CollectConfig(out_dir=out, sinks=[PacketSink(out)], log=False)
        )
    )
    timed_steps(timer, 8)
    timer.close()
    return out


@pytest.fixture(scope="module")
def packet_text(run_dir: Path) -> bytes:
    return next((run_dir / "packets").glob("*.json")).read_bytes()


@pytest.fixture(scope="module")
def payload() -> bytes:
    collector = CaptureCollector()
    timer = StageTimer(
        config=TimerConfig(window=4, sampling=SamplingConfig(cuda_event_fraction=0.0)),
        collector=collector,
    )
    timed_steps(timer, 4)
    timer.close()
    return encode_window(collector.windows[0])


@pytest.fixture(scope="module")
def trace_obj() -> dict[str, Any]:
    """A real profiler trace cut to its step and annotation ranges (fast to rewrite)."""
    header, events = load_events(trace("single-3-steps.json"))
    header["traceEvents"] = [e for e in events if e.get("cat") == "user_annotation"]
    return header


# --- the properties -------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_packet_json_mutations(packet_text: bytes, data: st.DataObject) -> None:
    obj = mutate_json(data, json.loads(packet_text))
    reads_or_refuses(lambda: packet_from_bytes(json.dumps(obj).encode()).reanalyze())
    with scratch() as folder:  # what `report` renders: the packet's stored report
        (folder / "packets").mkdir()
        (folder / "packets" / "window-000000.json").write_text(json.dumps(obj))
        reads_or_refuses(lambda: run_report_text(load_run(folder)))


@FUZZ
@given(data=st.data())
def test_packet_byte_mutations(packet_text: bytes, data: st.DataObject) -> None:
    raw = mutate_bytes(data, packet_text)
    reads_or_refuses(lambda: packet_from_bytes(raw).reanalyze())


@FUZZ
@given(data=st.data())
def test_windows_jsonl_mutations(run_dir: Path, data: st.DataObject) -> None:
    lines = (run_dir / "windows.jsonl").read_bytes().splitlines(keepends=True)
    record = mutate_json(data, json.loads(lines[0]))
    text = json.dumps(record).encode() + b"\n" + lines[1]
    if data.draw(st.booleans()):
        text = mutate_bytes(data, text)
    with scratch() as folder:
        (folder / "windows.jsonl").write_bytes(text)
        reads_or_refuses(lambda: read_records(folder / "windows.jsonl"))
        reads_or_refuses(lambda: window_report_text(load_window(folder, window=0).report))
        reads_or_refuses(lambda: run_report_text(load_run(folder)))


@FUZZ
@given(data=st.data())
def test_wire_payload_mutations(payload: bytes, data: st.DataObject) -> None:
    raw = mutate_bytes(data, payload)
    reads_or_refuses(lambda: decode_window(raw))


@FUZZ
@given(data=st.data())
def test_wire_metadata_mutations(payload: bytes, data: st.DataObject) -> None:
    from stagefrontier.collect.wire import HEADER_SIZE, read_header

    meta_len = read_header(payload)[5]
    meta = json.loads(payload[HEADER_SIZE : HEADER_SIZE + meta_len])
    new = json.dumps(mutate_json(data, meta)).encode()
    header = bytearray(payload[:HEADER_SIZE])
    header[HEADER_SIZE - 5 : HEADER_SIZE - 1] = len(new).to_bytes(4, "little")
    raw = bytes(header) + new + payload[HEADER_SIZE + meta_len :]
    reads_or_refuses(lambda: decode_window(raw))


@FUZZ
@given(data=st.data())
def test_kineto_trace_mutations(trace_obj: dict[str, Any], data: st.DataObject) -> None:
    obj = mutate_json(data, trace_obj, rounds=4)
    with scratch() as folder:
        path = folder / "trace.json"
        path.write_text(json.dumps(obj))
        reads_or_refuses(lambda: load_window(path, "kineto"))


@FUZZ
@given(data=st.data())
def test_kineto_trace_byte_mutations(trace_obj: dict[str, Any], data: st.DataObject) -> None:
    raw = mutate_bytes(data, json.dumps(trace_obj).encode())
    with scratch() as folder:
        path = folder / "trace.json"
        path.write_bytes(raw)
        reads_or_refuses(lambda: load_window(path))


NSYS_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=6),
)


def write_export(path: Path, rows: list[tuple[Any, ...]], enum: list[tuple[Any, ...]]) -> Path:
    """An export of the published schema, without its NOT NULL constraints (a reader must cope
    with whatever a file holds), written without syncing to disk."""
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.executescript(SCHEMA.replace(" NOT NULL", "").replace(" PRIMARY KEY", ""))
        db.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)", enum)
        db.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        db.commit()
    return path


@FUZZ
@given(data=st.data())
def test_nsight_export_mutations(data: st.DataObject) -> None:
    report = Report()
    report.steps(range(3))
    rows = [list(row) for row in report.rows if row[3] is not None]  # names as text
    for _ in range(data.draw(st.integers(1, 4))):
        row = data.draw(st.sampled_from(rows))
        row[data.draw(st.integers(0, len(row) - 1))] = data.draw(NSYS_VALUES)
    enum = [list(row) for row in ENUM]
    if data.draw(st.booleans()):
        data.draw(st.sampled_from(enum))[data.draw(st.integers(0, 1))] = data.draw(NSYS_VALUES)
    with scratch() as folder:
        path = write_export(
            folder / "report_rank0.sqlite", [tuple(r) for r in rows], [tuple(r) for r in enum]
        )
        reads_or_refuses(lambda: load_window(path))


def npz_bytes(arrays: dict[str, np.ndarray[Any, Any]], compressed: bool) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)  # type: ignore[operator]
    return buffer.getvalue()


ARRAYS = st.sampled_from(
    [
        np.zeros((2, 2, 3)),
        np.full((2, 1, 3), np.nan),
        np.ones((0, 2, 3)),
        np.arange(12).reshape(2, 2, 3),
        np.ones((3,)),
        np.array(["a", "b", "c"]),
        np.ones((2, 2, 3), dtype=np.complex128),
        np.ones((2, 2, 3), dtype=bool),
        np.array([b"a", b"b", b"c"]),
        np.array([[1.0, -1.0, 2.0]]).reshape(1, 1, 3),
    ]
)


@FUZZ
@given(data=st.data())
def test_npz_mutations(data: st.DataObject) -> None:
    arrays = {"d": np.full((3, 2, 3), 0.01), "stages": np.array(["a", "b", "step.other_cpu_wall"])}
    for key in data.draw(st.sets(st.sampled_from(["d", "stages", "roles"]))):
        arrays[key] = data.draw(ARRAYS)
    raw = npz_bytes(arrays, data.draw(st.booleans()))
    if data.draw(st.booleans()):
        raw = mutate_bytes(data, raw)
    with scratch() as folder:
        path = folder / "w.npz"
        path.write_bytes(raw)
        reads_or_refuses(lambda: load_window(path, "npz"))


def test_fuzz_inputs_are_valid_before_mutation(
    packet_text: bytes, payload: bytes, run_dir: Path, trace_obj: dict[str, Any]
) -> None:
    """The unmutated inputs read: the fuzzing starts from inputs the readers accept."""
    assert packet_from_bytes(packet_text).reanalyze().n_steps == 4
    assert decode_window(payload).durations_ns.shape[0] == 4
    assert len(read_records(run_dir / "windows.jsonl")) == 2
    with scratch() as folder:
        path = folder / "trace.json"
        path.write_text(json.dumps(trace_obj))
        assert load_window(path).report.n_steps == 3
    with zipfile.ZipFile(io.BytesIO(npz_bytes({"d": np.ones(1)}, True))) as archive:
        assert archive.namelist() == ["d.npy"]


# --- the profiler router's inputs: incidents, capture requests, node parts ------------------------


@pytest.fixture(scope="module")
def incident_obj(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An incident as ``stagefrontier incident`` leaves it: captured and reduced offline."""
    from stagefrontier.formats.incident import read_incident
    from stagefrontier.route.offline import reduce_offline
    from test_route_inputs import captured_incident

    folder, _ = captured_incident(tmp_path_factory.mktemp("incident"))
    reduce_offline(folder)
    return read_incident(folder)


@FUZZ
@given(data=st.data())
def test_incident_json_mutations(incident_obj: dict[str, Any], data: st.DataObject) -> None:
    from stagefrontier.formats.incident import read_incident
    from stagefrontier.render.incident import render_markdown, summary_line

    obj = mutate_json(data, incident_obj, rounds=4)
    raw = json.dumps(obj).encode()
    if data.draw(st.booleans()):
        raw = mutate_bytes(data, raw)
    with scratch() as folder:
        (folder / "incident.json").write_bytes(raw)

        def read_and_render() -> None:
            incident = read_incident(folder)
            summary_line(incident)
            render_markdown(incident)

        reads_or_refuses(read_and_render)


REQUESTS = [
    b'{"id": "w00001", "ranks": [2, 0], "first_step": 40, "steps": 5, "stage": "data.next_wait"}',
    b'{"id": "w00001", "rank": 2, "state": "captured", "reason": "", "path": "/x/rank2.json.gz",'
    b' "size": 10, "host": "h", "first_step": 40, "last_step": 44}',
    b'{"id": "c0ffee", "ranks": [1], "steps": 3, "stage": null}',
    b'{"id": "c0ffee", "state": "opened", "text": "/out/incidents/w00001-manual0"}',
]


@FUZZ
@given(data=st.data(), which=st.integers(0, len(REQUESTS) - 1))
def test_capture_request_mutations(data: st.DataObject, which: int) -> None:
    from stagefrontier.formats.names import is_plain_name
    from stagefrontier.route.requests import (
        CaptureRequest,
        CaptureStatus,
        ManualAnswer,
        ManualRequest,
    )

    decode = (CaptureRequest, CaptureStatus, ManualRequest, ManualAnswer)[which].decode
    raw = json.dumps(mutate_json(data, json.loads(REQUESTS[which]))).encode()
    if data.draw(st.booleans()):
        raw = mutate_bytes(data, raw)
    try:
        value = decode(raw)
    except sf.StageFrontierError:
        return
    assert is_plain_name(value.id) or value.id is None  # an id never becomes a path


@pytest.fixture(scope="module")
def node_part() -> bytes:
    from test_node_parts import _group

    return _group(0, {1: 30}).encode()


@FUZZ
@given(data=st.data())
def test_node_part_mutations(node_part: bytes, data: st.DataObject) -> None:
    from stagefrontier.collect.node_payload import decode_group

    reads_or_refuses(lambda: decode_group(mutate_bytes(data, node_part)))
