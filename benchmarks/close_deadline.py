"""How long ``timer.close()`` takes on rank 0 when its OpenTelemetry sink meets a receiver
that never answers, one that answers with 300 MB, or none at all, next to a timer without the
sink (issue 37, items 5 and 6).

Each probe trains a timer of windows of 5 steps for 10 steps in a process of its own, against a
socket server on loopback run by this script, and reports the wall time of ``close()`` and how
much the process's peak memory grew during it. The promise: every close within
``CLOSE_DEADLINE_S`` (30 s), whatever the sink's export timeout (60 s here).

    python benchmarks/close_deadline.py

Wall-clock figures on a shared machine: read them with the load average recorded beside them.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence

from harness_common import (
    command_line,
    load_1min,
    load_text,
    quiet_check,
    result_header,
    script_parser,
    write_result,
)
from stagefrontier.deadline import CLOSE_DEADLINE_S

PROBE = """\
import json, resource, sys, time
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.sinks import OtelSink

url = sys.argv[2]
sinks = () if url == "-" else (OtelSink(url, export_interval_s=86400, export_timeout_s=60),)
collection = CollectConfig("local", out_dir=sys.argv[1], log=False, sinks=sinks)
timer = StageTimer(config=TimerConfig(window=5, collection=collection))
for _ in range(10):
    with timer.step():
        with timer.stage("data.next_wait"):
            time.sleep(0.001)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
timer.close()
close_s = time.monotonic() - started
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"close_s": close_s, "grown_mb": grown / 1024}))
"""
HUGE_BYTES = 300 * 1024 * 1024


def _silent(connection: socket.socket) -> None:
    while connection.recv(65536):
        pass


def _huge(connection: socket.socket) -> None:
    connection.recv(65536)
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE_BYTES}\r\n\r\n".encode()
    block = bytes(1 << 20)
    try:
        connection.sendall(head)
        for _ in range(HUGE_BYTES >> 20):
            connection.sendall(block)
    except OSError:
        return


def _listen(answer: Callable[[socket.socket], None]) -> tuple[socket.socket, str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, f"http://127.0.0.1:{server.getsockname()[1]}/v1/metrics"


def _refused() -> str:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}/v1/metrics"


def measure(url: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, out, url],
            capture_output=True,
            text=True,
            timeout=CLOSE_DEADLINE_S + 300,
            check=True,
        )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = script_parser("close_deadline", __doc__).parse_args(argv)
    load_start, loads = load_text(), [load_1min()]
    silent, silent_url = _listen(_silent)
    huge, huge_url = _listen(_huge)
    probes = [
        ("no OpenTelemetry sink", "-"),
        ("a receiver that accepts and never answers", silent_url),
        ("a receiver that answers with 300 MB", huge_url),
        ("no receiver (connection refused)", _refused()),
    ]
    rows = []
    for name, url in probes:
        load = load_text()
        result = measure(url)
        rows.append((name, result, load))
        loads.append(load_1min())
        print(name, result, file=sys.stderr)
    silent.close()
    huge.close()
    lines = result_header(
        "timer.close() against slow, huge and absent OTLP receivers", command_line()
    )
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_text()}",
        "- Timer: one process, windows of 5 steps, 10 steps; `OtelSink(export_timeout_s=60)`",
        *quiet_check(loads),
        "",
        f"| probe | close (s) | within {CLOSE_DEADLINE_S:.0f} s | peak memory growth in close "
        "(MB) | load at start |",
        "|---|---:|---|---:|---|",
    ]
    for name, result, load in rows:
        within = "yes" if result["close_s"] <= CLOSE_DEADLINE_S else "no"
        lines.append(
            f"| {name} | {result['close_s']:.2f} | {within} | {result['grown_mb']:.0f} | {load} |"
        )
    lines += [
        "",
        "The silent receiver holds the sink's last export past the collector's 20 s share of the "
        "deadline: close() returns then and says so in one line, leaving the export to its "
        "daemon thread. An absent receiver's failed export is retried for the first 2 s of the "
        "close only. A receiver's answer is read up to 64 KiB.",
        "",
    ]
    text = "\n".join(lines)
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
