"""What the profiler router reads from outside: crafted ``incident.json`` files, capture requests
and answers written into the job's store, and the ``incident`` and ``capture`` commands' input.
Every such input is read, or refused with one line (exit code 2 from the CLI, a
ReportFormatError from the API, a note in the router); nothing is read from outside the run
folder, nothing blocks, nothing grows with a number the input states."""

from __future__ import annotations

import ast
import gzip
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.cli import main
from stagefrontier.errors import ReportFormatError
from stagefrontier.formats.incident import check_incident, new_incident, read_incident
from stagefrontier.render.incident import open_commands, render_markdown, write_incident
from stagefrontier.route.requests import (
    MAX_CAPTURE_STEPS,
    MAX_VALUE_BYTES,
    CaptureRequest,
    CaptureStatus,
    ManualAnswer,
    ManualRequest,
)

HANG_GUARD_S = 50.0
"""A command that used to block (a FIFO read, a dead store) runs under this limit: it ends in
a fraction of it now, and failed by timing out before the fix."""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("stagefrontier: error: "), err
    assert "a bug" not in err and "frame #" not in err, err
    assert needle in err, err


def cli(*argv: str, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess[str]:
    """The command in its own process (what a user runs; a hang is cut by the guard)."""
    return subprocess.run(
        [sys.executable, "-m", "stagefrontier.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


# --- incidents on disk ----------------------------------------------------------------------------


def trace(path: Path, steps: range, sleep_us: float = 100.0) -> Path:
    """A small Kineto-format trace of ``steps`` with a data stage holding a user function."""
    events = []
    for step in steps:
        t0 = 1000.0 * step
        events += [
            {"name": f"stagefrontier.step#{step}", "ts": t0, "dur": 1000},
            {"name": "data.next_wait", "ts": t0 + 10, "dur": 600},
            {"name": "loader.py(12): collate", "ts": t0 + 20, "dur": 400, "cat": "python_function"},
            {
                "name": "<built-in function sleep>",
                "ts": t0 + 30,
                "dur": sleep_us,
                "cat": "python_function",
            },
        ]
    for event in events:
        event.setdefault("cat", "user_annotation")
        event.update(ph="X", pid=1, tid=7)
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    return path


def captured_incident(out_dir: Path, incident_id: str = "w00001") -> tuple[Path, dict[str, Any]]:
    """A captured, not yet reduced incident of ranks 1 (suspect) and 0, traces in its folder."""
    folder = out_dir / "incidents" / incident_id
    folder.mkdir(parents=True)
    files = {r: trace(folder / f"rank{r}.pt.trace.json.gz", range(10, 13)) for r in (1, 0)}
    incident = new_incident(incident_id, "window")
    incident.update(
        window=1,
        steps=[10, 12],
        stage="data.next_wait",
        leader_rank=1,
        reference_rank=0,
        requested_ranks=[1, 0],
        ranks=[0, 1],
        trace_files={str(r): str(p) for r, p in files.items()},
        trace_hosts={"0": "h", "1": "h"},
        trace_bytes={str(r): p.stat().st_size for r, p in files.items()},
        captured=True,
    )
    write_incident(folder, incident)
    return folder, incident


def rewrite(folder: Path, **changes: Any) -> Path:
    """The incident's JSON with fields replaced, written without validation (as by hand)."""
    path = folder / "incident.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


OP_ROW = {"name": "f", "suspect_ms_per_step": 1.0, "reference_ms_per_step": 2.0}


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("steps", [0, 300_000_000], "steps"),
        ("steps", [5, 3], "steps"),
        ("steps", [-1, 3], "steps"),
        ("steps", [1.5, 3], "steps"),
        ("leader_rank", -2, "leader_rank"),
        ("window", -1, "window"),
        ("trigger", "whenever", "trigger"),
        ("ranks", ["0"], "ranks"),
        ("requested_ranks", [10**30], "requested_ranks"),
        ("trace_files", {"zero": "x"}, "trace_files"),
        ("trace_files", {"0": 5}, "trace_files"),
        ("trace_bytes", {"0": -4}, "trace_bytes"),
        ("trace_shares", {"data.next_wait": "big"}, "trace_shares"),
        ("live_shares", {"data.next_wait": 1e400}, "live_shares"),
        ("max_share_diff", -0.5, "max_share_diff"),
        ("reasons", ["ok", 3], "reasons"),
        ("op_diff", [{**OP_ROW, "reference_ms_per_step": "x"}], "op_diff"),
        ("op_diff", [{**OP_ROW, "call_path": [4]}], "call_path"),
        ("regression", {"top_stage": "x"}, "regression"),
        ("reference_capture", {"path": "x", "rank": 0, "steps": [0, 10**9]}, "reference_capture"),
        ("reference_capture", {"path": "x", "rank": -1, "steps": [0, 2]}, "reference_capture"),
        ("id", "../../../x", "id"),
        ("id", "a/b", "id"),
        ("stage", "s" * 5000, "stage"),
    ],
)
def test_every_incident_field_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, needle: str
) -> None:
    """Item 5 and 16 (unchecked fields ended in "a bug: please report"): a crafted field is one
    line and exit code 2, before anything is allocated or read from what it states."""
    folder, incident = captured_incident(tmp_path)
    with pytest.raises(ReportFormatError, match=needle):
        check_incident({**incident, field: value})
    rewrite(folder, **{field: value})
    assert_one_line_error(*run(["incident", str(folder)], capsys), needle)


def test_a_huge_step_range_is_refused_before_any_allocation(tmp_path: Path) -> None:
    folder, _ = captured_incident(tmp_path)
    rewrite(folder, steps=[0, 300_000_000])
    done = cli("incident", str(folder))
    assert done.returncode == 2, done.stderr
    assert f"at most {MAX_CAPTURE_STEPS}" in done.stderr and done.stderr.count("\n") == 1


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where", ["fifo", "dev_zero", "outside", "symlink_outside"])
def test_a_reference_trace_must_be_a_regular_file_inside_the_run_folder(
    tmp_path: Path, where: str
) -> None:
    """Item 5: a reference_capture.path at a FIFO blocked for 20 minutes, at /dev/zero read
    1.1 GB, outside the run folder read that file. None of them is opened now: the op diff
    runs without the reference and the incident says why."""
    out_dir = tmp_path / "run"
    folder, _ = captured_incident(out_dir)
    secret = trace(tmp_path / "secret.pt.trace.json.gz", range(10, 13), sleep_us=300.0)
    path = {
        "fifo": lambda: _fifo(out_dir / "ref.pt.trace.json.gz"),
        "dev_zero": lambda: Path("/dev/zero"),
        "outside": lambda: secret,
        "symlink_outside": lambda: (
            (out_dir / "link.json.gz").symlink_to(secret) or out_dir / "link.json.gz"
        ),
    }[where]()
    rewrite(folder, reference_capture={"path": str(path), "rank": 1, "steps": [10, 12]})
    done = cli("incident", str(folder))
    assert done.returncode == 0, done.stderr
    incident = read_incident(folder)
    assert any("not a regular file inside the run folder" in r for r in incident["reasons"]), (
        incident["reasons"]
    )
    # Diffed against the reference rank's trace (100 us of sleep a step), not the file outside
    # the run folder (300 us).
    sleep = next(row for row in incident["op_diff"] if "sleep" in row["name"])
    assert sleep["reference_ms_per_step"] == pytest.approx(0.1), incident["op_diff"]


@pytest.mark.parametrize("what", ["fifo", "dev_zero_link", "dotdot"])
def test_a_trace_file_that_is_not_a_regular_file_in_the_folder_is_not_read(
    tmp_path: Path, what: str
) -> None:
    folder, incident = captured_incident(tmp_path / "run")
    local = folder / "rank1.pt.trace.json.gz"
    local.unlink()
    if what == "fifo":
        _fifo(local)
    elif what == "dev_zero_link":
        local.symlink_to("/dev/zero")
    else:
        rewrite(folder, trace_files={**incident["trace_files"], "1": str(folder / "..")})
    done = cli("incident", str(folder))
    assert done.returncode == 0, done.stderr
    assert read_incident(folder)["confirmed"] is None  # not reduced: its trace is not here
    assert "not reduced" in done.stdout


def test_incident_json_itself_at_a_fifo_or_oversized_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "incidents" / "w00003"
    folder.mkdir(parents=True)
    _fifo(folder / "incident.json")
    done = cli("incident", str(folder))
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    (folder / "incident.json").unlink()
    (folder / "incident.json").write_text(" " * (17 << 20))
    assert_one_line_error(*run(["incident", str(folder)], capsys), "over the limit")


# --- names that become paths (item 11) ------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../../../x", "a/b", "..", ".", "", "x\x00y", "-rf", "é" * 3])
def test_request_and_status_ids_must_be_plain_names(bad: str) -> None:
    request = {"id": bad, "ranks": [0], "first_step": 3, "steps": 2, "stage": None}
    with pytest.raises(ReportFormatError, match="plain name"):
        CaptureRequest.decode(json.dumps(request).encode())
    with pytest.raises(ReportFormatError, match="plain name"):
        CaptureStatus.decode(json.dumps({"id": bad, "rank": 0, "state": "skipped"}).encode())
    with pytest.raises(ReportFormatError, match="plain name"):
        ManualRequest.decode(json.dumps({"id": bad, "ranks": [0], "steps": 2}).encode())
    with pytest.raises(ReportFormatError, match="id"):
        check_incident({**new_incident("w00001", "window"), "id": bad})


@pytest.mark.parametrize(
    "value",
    [
        {"id": "w1", "ranks": [True], "first_step": 3, "steps": 2},
        {"id": "w1", "ranks": [0], "first_step": 3, "steps": 2**70},
        {"id": "w1", "ranks": [0], "first_step": 2**70, "steps": 2},
        {"id": "w1", "ranks": [0] * 10_000, "first_step": 3, "steps": 2},
        {"id": "w1", "ranks": [0], "first_step": 3, "steps": 2, "stage": 5},
        {"id": "w1", "ranks": [0], "first_step": 3.0, "steps": 2},
    ],
)
def test_capture_requests_are_checked_field_by_field(value: dict[str, Any]) -> None:
    with pytest.raises(ReportFormatError):
        CaptureRequest.decode(json.dumps(value).encode())


@pytest.mark.parametrize(
    "value",
    [
        {"id": "w1", "rank": "0", "state": "captured"},
        {"id": "w1", "rank": 0, "state": "captured", "size": -1},
        {"id": "w1", "rank": 0, "state": "captured", "path": 7},
        {"id": "w1", "rank": 0, "state": "captured", "last_step": "x"},
    ],
)
def test_capture_answers_are_checked_field_by_field(value: dict[str, Any]) -> None:
    with pytest.raises(ReportFormatError):
        CaptureStatus.decode(json.dumps(value).encode())


def test_deeply_nested_json_in_the_store_is_a_format_error() -> None:
    """Item 12: ``RecursionError`` escaped the decoders (and the router's handler)."""
    deep = b"[" * 30_000 + b"]" * 30_000  # within the 64 KiB a value may hold
    for decode in (CaptureRequest.decode, CaptureStatus.decode, ManualRequest.decode):
        with pytest.raises(ReportFormatError, match="nested"):
            decode(deep)
    with pytest.raises(ReportFormatError):
        ManualAnswer.decode(deep)


# --- what is printed (item 13) --------------------------------------------------------------------

EVIL = "data\x1b[2J\x1b[31m\nforged: confirmed\r\u202e"


def assert_clean(text: str) -> None:
    for char in ("\x1b", "\r", "\u202e"):
        assert char not in text, repr(text)
    assert "\nforged" not in text, text


def test_incident_text_is_escaped_and_its_commands_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "a run $(touch pwned) 'x'"
    folder, incident = captured_incident(out_dir)
    incident.update(
        stage=EVIL,
        confirmed=False,
        reasons=[EVIL],
        trace_shares={EVIL: 0.5},
        live_shares={EVIL: 0.4},
        op_diff=[{"name": EVIL, "suspect_ms_per_step": 1.0, "reference_ms_per_step": 0.0}],
    )
    write_incident(folder, incident)
    assert_clean((folder / "incident.md").read_text())
    assert_clean(render_markdown(incident))
    code, out, err = run(["incident", str(folder)], capsys)
    assert code == 0, err
    assert_clean(out)
    commands = [c for c in open_commands(incident) if not c.startswith("#")]
    names = {Path(path).name for path in incident["trace_files"].values()}
    for command in commands:  # run in the incident's folder: "." and the traces' names
        words = shlex.split(command, comments=True)
        assert not any("$(" in w for w in words) and str(folder) not in command
        if "-c" in words:
            code_text = words[words.index("-c") + 1]
            literals = {
                node.value
                for node in ast.walk(ast.parse(code_text))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            }
            assert names | {"."} <= literals, literals
        else:
            assert "." in words, words
    assert not (Path.cwd() / "pwned").exists()


# --- stagefrontier capture: bad options and a dead store (item 15) -------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--store", "127.0.0.1:99999"], "port"),
        (["--store", "127.0.0.1:0"], "port"),
        (["--store", ":5"], "HOST:PORT"),
        (["--ranks=-1"], "--ranks"),
        (["--ranks", "a"], "--ranks"),
        (["--ranks", ",,"], "--ranks"),
        (["--wait", "-5"], "--wait"),
        (["--wait", "nan"], "--wait"),
        (["--wait", "inf"], "--wait"),
        (["--attempt", "-3"], "--attempt"),
        (["--steps", "0"], "--steps"),
        (["--steps", str(MAX_CAPTURE_STEPS + 1)], "--steps"),
        (["--run-id", "a/../b"], "--run-id"),
    ],
)
def test_capture_options_are_checked(
    capsys: pytest.CaptureFixture[str], options: list[str], needle: str
) -> None:
    base = ["capture", "--store", "127.0.0.1:29500", "--ranks", "0", "--wait", "1"]
    assert_one_line_error(*run([*base, *options], capsys), needle)  # the last one counts


def test_capture_against_a_dead_store_is_one_line_within_its_wait() -> None:
    done = cli("capture", "--store", f"127.0.0.1:{free_port()}", "--ranks", "0", "--wait", "1")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "cannot reach the store" in done.stderr, done.stderr


# --- a running job: requests in its store (items 9, 11, 12, 16) -----------------------------------


@pytest.fixture
def store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    return dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )


def job(out_dir: Path, store: Any, **router: Any) -> Any:
    """A one-rank job with a router, no regression check (only the tests' requests capture)."""
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    settings = {"steps": 2, "store": store, "capture_timeout_s": 5.0}
    return StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig("local", out_dir=out_dir, regression=None),
            router=ProfilerRouter(**{**settings, **router}),
        )
    )


def capture_cli(store: Any, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stagefrontier.cli", "capture", "--store",
         f"127.0.0.1:{store.port}", "--wait", "180", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip


def train_while(timer: Any, *clis: subprocess.Popen[str]) -> list[tuple[int, str, str]]:
    """Train until every command ended; their exit codes and outputs."""
    from test_route import UNTIL_DONE, _train

    ran = _train(timer, UNTIL_DONE, done=lambda: all(c.poll() is not None for c in clis))
    assert ran < UNTIL_DONE
    return [(c.returncode, *c.communicate(timeout=60)) for c in clis]


def test_two_capture_commands_each_get_their_own_incident(tmp_path: Path, store: Any) -> None:
    """Item 9: two ``stagefrontier capture`` calls printed each other's incident folder (and
    the second request overwrote the first)."""
    timer = job(tmp_path, store)
    try:
        done = train_while(
            timer,
            capture_cli(store, "--ranks", "0", "--steps", "2"),
            capture_cli(store, "--ranks", "0", "--steps", "3"),
        )
    finally:
        timer.close()
    spans = []
    for code, out, err in done:
        assert code == 0, (out, err)
        incident = read_incident(Path(out.strip()))
        assert incident["trigger"] == "manual", incident
        spans.append(incident["steps"][1] - incident["steps"][0] + 1)
    # Each command printed the incident of its own request (whether the capture then ran in
    # time is the start margin's business, which a loaded machine can outrun).
    assert spans == [2, 3]


def test_a_rank_outside_the_world_is_refused_at_once_without_spending_a_capture(
    tmp_path: Path, store: Any
) -> None:
    timer = job(tmp_path, store, max_captures=1)
    try:
        [(code, out, err)] = train_while(timer, capture_cli(store, "--ranks", "0,5"))
        assert code == 1 and out.startswith("refused: rank 5 outside the job's 1 ranks"), out
        [(code, out, err)] = train_while(timer, capture_cli(store, "--ranks", "0"))
    finally:
        timer.close()
    assert code == 0, (out, err)
    assert read_incident(Path(out.strip()))["trigger"] == "manual"  # the budget was not spent


def write_request(store: Any, value: bytes) -> None:
    from stagefrontier.route.requests import REQUEST_KEY, RequestChannel

    RequestChannel(store).write(REQUEST_KEY, value)


def train_until(timer: Any, seen: Any, then: int = 40) -> None:
    """Train until ``seen()`` holds, then ``then`` steps more (many polls of the router)."""
    from test_route import UNTIL_DONE, _train

    assert _train(timer, UNTIL_DONE, done=seen) < UNTIL_DONE
    _train(timer, then)


@pytest.mark.parametrize(
    "value", [b"\xff not json", b"[" * 30_000 + b"]" * 30_000, b'{"id": 1}'], ids=str
)
def test_a_bad_request_in_the_store_is_warned_about_once(
    tmp_path: Path, store: Any, caplog: pytest.LogCaptureFixture, value: bytes
) -> None:
    """Item 12: about 20 warnings a second on every rank while the key existed; deeply nested
    JSON escaped the handler and logged a traceback every poll."""
    import logging

    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer = job(tmp_path, store, poll_s=0.01)
    write_request(store, value)

    def rejected() -> list[str]:
        return [r.getMessage() for r in caplog.records if "request rejected" in r.getMessage()]

    try:
        train_until(timer, lambda: bool(rejected()))
        assert len(rejected()) == 1, rejected()
        write_request(store, value + b" ")  # another value: warned about too
        train_until(timer, lambda: len(rejected()) > 1)
    finally:
        timer.close()
    assert len(rejected()) == 2, rejected()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_an_oversized_request_is_fetched_once_then_left_unread_for_a_while(
    tmp_path: Path, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37 item 8: an 8 MB value in the request key was fetched whole at every poll (the
    64 KiB check ran after each fetch): 5 to 9% of every rank's step time. Now, once refused, the
    key is not read again for ``OVERSIZED_REREAD_S``. The router's channel to the real store is
    wrapped to count the values it fetched."""
    import logging
    import time

    from stagefrontier.route.router import OVERSIZED_REREAD_S

    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer = job(tmp_path, store, poll_s=0.01)
    oversized = b'{"id": "' + b"x" * (1 << 20) + b'"}'
    channel = timer._router._channel
    fetched: list[float] = []
    read = channel.read

    def counted(key: str) -> bytes | None:
        value = read(key)
        if value is not None and len(value) > MAX_VALUE_BYTES:
            fetched.append(time.monotonic())
        return value

    channel.read = counted
    write_request(store, oversized)
    try:
        train_until(timer, lambda: bool(fetched), then=0)
        first = fetched[0]
        train_until(timer, lambda: True, then=25)  # half a second at least: 50 polls
        # Past its first fetch, at most one more per OVERSIZED_REREAD_S however many polls ran.
        span = time.monotonic() - first
        assert len(fetched) <= 1 + int(span / OVERSIZED_REREAD_S), (len(fetched), span)
    finally:
        timer.close()
    rejected = [r.getMessage() for r in caplog.records if "request rejected" in r.getMessage()]
    assert len(rejected) == 1, rejected


def test_a_request_id_that_is_a_path_is_rejected(
    tmp_path: Path, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 11: a request id ``../../../x`` made the named rank write its trace outside
    ``out_dir``."""
    import logging

    caplog.set_level(logging.WARNING, logger="stagefrontier")
    out_dir = tmp_path / "a" / "b" / "out"
    timer = job(out_dir, store)
    request = {"id": "../../../x", "ranks": [0], "first_step": 3, "steps": 2, "stage": None}
    write_request(store, json.dumps(request).encode())
    try:
        train_until(timer, lambda: "plain name" in caplog.text, then=20)
    finally:
        timer.close()
    assert not list(tmp_path.rglob("*.pt.trace.json*")), list(tmp_path.rglob("*"))
    assert not (out_dir / "incidents").exists()


def test_a_stale_far_future_request_does_not_block_later_captures(
    tmp_path: Path, store: Any
) -> None:
    """Item 16: a request for a step the run never reaches kept its ranks armed, and every
    later capture on them was skipped ("another capture is in progress")."""
    from stagefrontier.route.requests import CaptureRequest

    timer = job(tmp_path, store)
    write_request(store, CaptureRequest("stale", (0,), 10**9, 2).encode())
    try:
        train_until(timer, lambda: timer._capture, then=5)  # armed: waiting for step 10**9
        [(code, out, err)] = train_while(timer, capture_cli(store, "--ranks", "0"))
    finally:
        timer.close()
    assert code == 0, (out, err)
    incident = read_incident(Path(out.strip()))
    assert not any("another capture" in r for r in incident["reasons"]), incident["reasons"]


# --- the small list (item 16) and the bound of a compare side (item 6) ---------------------------


def test_a_corrupt_incident_is_named_by_incident_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stagefrontier.formats.run_folder import load_run
    from stagefrontier.render.text import run_report_text
    from test_cli_bad_inputs import run_folder

    out_dir = run_folder(tmp_path / "run")
    captured_incident(out_dir, "w00001")
    bad = out_dir / "incidents" / "w00002" / "incident.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    code, out, err = run(["incident", str(out_dir)], capsys)
    assert code == 0 and "Incident w00001" in out
    assert f"skipped {bad}: not a readable incident" in err
    assert f"skipped {bad}" in run_report_text(load_run(out_dir))


def test_a_renamed_incident_folder_is_read_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = captured_incident(tmp_path, "w00001")
    folder.rename(folder.with_name("w00001-copy"))
    code, out, err = run(["incident", str(tmp_path)], capsys)
    assert code == 0, err
    assert "Incident w00001" in out and "w00001-copy/incident.json" in out


def test_a_request_before_any_window_says_the_step_time_is_unknown(tmp_path: Path) -> None:
    from stagefrontier import ProfilerRouter
    from stagefrontier.route.coordinator import Coordinator
    from test_route import _Channel

    coordinator = Coordinator(
        ProfilerRouter(), out_dir=str(tmp_path), channel=_Channel(), current_step=lambda: 0
    )  # type: ignore[arg-type]
    coordinator.request_capture([0], 2)
    coordinator.tick()
    assert coordinator.open is not None
    reasons = " ".join(coordinator.open.incident["reasons"])
    assert "nan" not in reasons and "unknown step time" in reasons


@pytest.mark.parametrize("command", ["compare", "analyze"])
def test_stages_naming_no_stage_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    from test_cli_bad_inputs import run_folder

    out_dir = str(run_folder(tmp_path / "run"))
    argv = [command, out_dir, out_dir] if command == "compare" else [command, out_dir]
    assert_one_line_error(*run([*argv, "--stages", ",,"], capsys), "names no stage")


def test_compare_says_dev_zero_is_not_a_packet(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(
        *run(["compare", "/dev/zero", "/dev/zero"], capsys), "neither a packet file nor"
    )


def test_a_compare_side_is_bounded_whatever_the_number_of_packets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: eight packets within the limits each took 5.9 GB together. A side now holds
    about ``SIDE_CELLS`` cells at most: a range of more is compared on evenly spaced whole
    windows, said in one line (issue 38: it used to be refused, with a setting to raise)."""
    from stagefrontier.formats import sides
    from stagefrontier.formats.packet import read_packet
    from test_cli_bad_inputs import run_folder

    out_dir = run_folder(tmp_path / "run")  # two windows
    cells = read_packet(next((out_dir / "packets").glob("*.json"))).d.size
    monkeypatch.setattr(sides, "SIDE_CELLS", cells + cells // 2)
    code, _, err = run(["compare", f"{out_dir}:0", f"{out_dir}:1"], capsys)
    assert code == 0 and not err, err  # one window a side fits
    code, _, err = run(["compare", str(out_dir), f"{out_dir}:1"], capsys)
    assert code == 0, err
    assert err.count("\n") == 1 and "comparing one window in 2 (1 windows" in err, err
