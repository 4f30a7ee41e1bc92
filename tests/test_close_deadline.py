"""``StageTimer.close()`` is bounded by one deadline whatever its sinks do (issue 37, items 5
to 7): an OTLP receiver that accepts and never answers, one that answers with 300 MB.

Each timer trains and closes in a process of its own, against a real receiver on loopback (a
plain socket server), so a close that overran would hold only that process (the test's
``timeout`` ends it).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.metrics", reason="pip install '.[otel]'")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")

from rank_support import refused_port
from stagefrontier.deadline import (
    CLOSE_DEADLINE_S,
    DEADLINE_VARIABLE,
    close_deadline_s,
    router_close_s,
)
from stagefrontier.errors import SinkSettingError
from stagefrontier.sinks import OtelSink

TRAIN_AND_CLOSE = textwrap.dedent("""\
    import logging, resource, sys, time
    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.sinks import OtelSink

    logging.basicConfig(format="%(message)s")  # the application shows warnings on stderr
    sink = OtelSink(sys.argv[2], export_interval_s=86400, export_timeout_s=86400)
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig(
                "local", out_dir=sys.argv[1], regression=None, sinks=(sink,)
            ),
        )
    )
    for _ in range(10):
        with timer.step():
            with timer.stage("data.next_wait"):
                time.sleep(0.001)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    timer.close()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(f"closed; peak memory grew {grown // 1024} MB")
""")


SHORT_DEADLINE_S = 6.0
"""The close deadline of the test that waits one out."""


def _serve(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback HTTP endpoint whose every connection is handed to ``answer``."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            held.append(connection)
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1/metrics"
    server.close()
    for connection in held:
        connection.close()


@pytest.fixture
def silent_receiver() -> Iterator[str]:
    """Accepts, reads the request, never answers."""

    def read_forever(connection: socket.socket) -> None:
        while connection.recv(65536):
            pass

    yield from _serve(read_forever)


@pytest.fixture
def huge_answer_receiver() -> Iterator[str]:
    """Answers every request with a 300 MB body."""
    size = 300 * 1024 * 1024

    def answer(connection: socket.socket) -> None:
        connection.recv(65536)
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {size}\r\n\r\n"
        )
        chunk = bytes(1024 * 1024)
        try:
            connection.sendall(head.encode())
            for _ in range(size // len(chunk)):
                connection.sendall(chunk)
        except OSError:  # the client closed the connection on the rest: what it should do
            return

    yield from _serve(answer)


def _train_and_close(
    out: str, url: str, script: str = TRAIN_AND_CLOSE, deadline_s: float = CLOSE_DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    """``script`` run to its end in a process of its own, its close deadline ``deadline_s``."""
    return subprocess.run(
        [sys.executable, "-c", script, out, url],
        capture_output=True,
        text=True,
        timeout=CLOSE_DEADLINE_S + 120,
        env={**os.environ, DEADLINE_VARIABLE: str(deadline_s)},
    )


def test_close_returns_by_its_deadline_when_the_receiver_never_answers(
    silent_receiver: str, tmp_path: Path
) -> None:
    """Before: close() waited out the export timeout (up to 86,400 s) on the last export. The
    deadline is shortened to ``SHORT_DEADLINE_S`` (the test waits out the collector's part of
    it); the default's split is checked below."""
    done = _train_and_close(str(tmp_path), silent_receiver, deadline_s=SHORT_DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert "closed;" in done.stdout
    bound = SHORT_DEADLINE_S - router_close_s(SHORT_DEADLINE_S)
    assert (
        f"stagefrontier: the collector still ran {bound:.3g} s into close(), its bound of the "
        f"{SHORT_DEADLINE_S:.3g} s close deadline; the timer returns without it" in done.stderr
    )
    assert "Traceback" not in done.stderr


PROFILER_START = "import torch\nprof = torch.profiler.profile(with_stack=True)\nprof.start()\n"
PROFILER_STOP = (
    'torch.ones(4).sum()\nprof.stop()\nprint("the profiler stopped", bool(prof.events()))\n'
)
PROFILED_CLOSE = TRAIN_AND_CLOSE.replace("before = resource", PROFILER_START + "before = resource")
PROFILED_CLOSE = PROFILED_CLOSE.replace('print(f"closed;', PROFILER_STOP + 'print(f"closed;')
"""TRAIN_AND_CLOSE with the application's own profiler (its Python tracer on) running at close."""


def test_close_returns_by_its_deadline_while_the_applications_profiler_runs(
    silent_receiver: str, tmp_path: Path
) -> None:
    """Before: while a PyTorch profiler ran at close, the collector closed on the calling thread
    with no bound (a thread started under the profiler's Python tracer was thought to crash it),
    so this close waited out the export's 86,400 s. Now the same deadline holds, the
    profiler's own session runs on untouched, stops and holds its events."""
    done = _train_and_close(
        str(tmp_path), silent_receiver, PROFILED_CLOSE, deadline_s=SHORT_DEADLINE_S
    )
    assert done.returncode == 0, done.stderr
    assert "the profiler stopped True" in done.stdout and "closed;" in done.stdout
    bound = SHORT_DEADLINE_S - router_close_s(SHORT_DEADLINE_S)
    assert f"the collector still ran {bound:.3g} s into close()" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_close_deadline_is_30_s_unless_the_environment_sets_a_valid_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("stagefrontier")
    monkeypatch.delenv(DEADLINE_VARIABLE, raising=False)
    assert close_deadline_s(log) == CLOSE_DEADLINE_S == 30.0
    assert router_close_s(CLOSE_DEADLINE_S) == 10.0  # the collector's part: 20 s
    monkeypatch.setenv(DEADLINE_VARIABLE, " 6 ")
    assert close_deadline_s(log) == 6.0 and router_close_s(6.0) == 2.0
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        for text in ("soon", "0", "nan", "1e9", "soon"):
            monkeypatch.setenv(DEADLINE_VARIABLE, text)
            assert close_deadline_s(log) == CLOSE_DEADLINE_S
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4 and all("the close deadline stays 30 s" in m for m in said), said


def test_a_huge_answer_is_not_read_into_memory(huge_answer_receiver: str, tmp_path: Path) -> None:
    """Before: the 300 MB body of every answer was read whole (a peak of 659 MB)."""
    done = _train_and_close(str(tmp_path), huge_answer_receiver)
    assert done.returncode == 0, done.stderr
    grown_mb = int(done.stdout.split("peak memory grew ")[1].split()[0])
    assert grown_mb < 100, done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "endpoint", ["not a url", "localhost:4318", "ftp://host/v1/metrics", "http://:4318/x"]
)
def test_an_endpoint_that_is_not_an_http_url_is_refused(endpoint: str) -> None:
    with pytest.raises(SinkSettingError, match="must be an http:// or https:// URL"):
        OtelSink(endpoint)


DEAD_ENDPOINT = textwrap.dedent("""\
    import logging, sys, time
    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.sinks import OtelSink

    logging.basicConfig(format="%(message)s")  # the SDK's loggers would show here too
    sink = OtelSink(sys.argv[2], export_interval_s=0.2, export_timeout_s=1)
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig("local", out_dir=sys.argv[1], log=False, sinks=(sink,)),
        )
    )
    end = time.monotonic() + 3  # about 15 exports, each failing
    while time.monotonic() < end:
        with timer.step():
            with timer.stage("data.next_wait"):
                time.sleep(0.01)
    timer.close()
""")


def test_failed_exports_are_said_in_the_librarys_words_only(tmp_path: Path) -> None:
    """Item 12: before, the OpenTelemetry SDK logged its own line on every failed export (and
    every retry) beside the sink's one line."""
    with refused_port() as port:  # every export is refused
        url = f"http://127.0.0.1:{port}/v1/metrics"
        done = _train_and_close(str(tmp_path), url, DEAD_ENDPOINT)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"stagefrontier: OpenTelemetry export to {url} failed")
    assert "OpenTelemetry export(s) to" in lines[1] and "failed in this run" in lines[1]


def test_a_receiver_that_is_not_there_is_not_retried_past_the_first_seconds_of_close(
    tmp_path: Path,
) -> None:
    """Before: the SDK retried the last export, backing off, until its export timeout (the
    collector's whole 20 s share of the deadline here, 10-13 s with the default timeout)."""
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/v1/metrics"
        done = _train_and_close(str(tmp_path), url)
    assert done.returncode == 0, done.stderr
    assert "closed;" in done.stdout
    assert "into close()" not in done.stderr  # returned before its bound, not cut by it
    assert "OpenTelemetry export(s) to" in done.stderr
