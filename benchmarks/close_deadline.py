"""How long ``timer.close()`` takes on rank 0 when its OpenTelemetry sink meets a receiver
that never answers, one that answers late, one that answers with 300 MB, or none at all, next
to a timer without the sink; and when the job's store hangs under its collector and profiler
router (issue 37, items 5 to 7).

Each OTLP probe trains a timer of windows of 5 steps for 10 steps in a process of its own,
against a socket server on loopback run by this script. The store probe trains a timer
collecting through a real TCP store, with a profiler router polling it, for 10 steps; the
store's server (a process of its own) is then stopped (SIGSTOP: its port still accepts
connections, nothing answers) and the timer trains 10 steps more and closes. Each row reports
the wall time of ``close()``, how much the process's peak memory grew during it, and the
process's exit status. The promise: every close within ``CLOSE_DEADLINE_S`` (30 s), whatever
the sink's export timeout (60 s here), and a clean exit.

    python benchmarks/close_deadline.py

Wall-clock figures on a shared machine: read them with the load average recorded beside them.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
STORE_SERVER = """\
import time
from stagefrontier.collect.node_store import loopback_store

store = loopback_store(1)
print(store.port, flush=True)
time.sleep(3600)
"""
STORE_PROBE = """\
import json, resource, sys, time
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from stagefrontier import ProfilerRouter, StageTimer, TimerConfig
from stagefrontier.collect import CollectorSettings, StoreCollector

folder, port = Path(sys.argv[1]), int(sys.argv[2])
client = dist.TCPStore(
    "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False
)
settings = CollectorSettings(0, 1, folder, 2.0, regression=None)
timer = StageTimer(
    config=TimerConfig(
        stages=["data.next_wait"], window=5, router=ProfilerRouter(store=client, poll_s=0.05)
    ),
    collector=StoreCollector(settings, store=client),
)


def steps(count):
    for _ in range(count):
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.001)


steps(10)
print("ready", flush=True)
sys.stdin.readline()  # the store's server is stopped
steps(10)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
timer.close()
close_s = time.monotonic() - started
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"close_s": close_s, "grown_mb": grown / 1024}), flush=True)
"""
HUGE_BYTES = 300 * 1024 * 1024
LATE_S = 10.0
"""The late receiver's delay before each answer (within the collector's 20 s share)."""


def _silent(connection: socket.socket) -> None:
    while connection.recv(65536):
        pass


def _late(connection: socket.socket) -> None:
    while connection.recv(65536):
        time.sleep(LATE_S)
        try:
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            return


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
        )
    return _result(done.returncode, done.stdout)


def measure_hung_store() -> dict[str, float]:
    """The store probe: its server stopped between the probe's two runs of steps."""
    server = subprocess.Popen(
        [sys.executable, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as out:
            probe = subprocess.Popen(
                [sys.executable, "-c", STORE_PROBE, out, port],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert probe.stdout is not None and probe.stdout.readline() == "ready\n"
            os.kill(server.pid, signal.SIGSTOP)
            stdout, _ = probe.communicate("go\n", timeout=CLOSE_DEADLINE_S + 300)
    finally:
        server.kill()
        server.wait()
    return _result(probe.returncode, stdout)


def _result(returncode: int, stdout: str) -> dict[str, float]:
    """A probe's figures (none when it printed none) and its exit status."""
    lines = stdout.strip().splitlines()
    result: dict[str, float] = json.loads(lines[-1]) if lines else {}
    result["exit"] = returncode
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = script_parser("close_deadline", __doc__).parse_args(argv)
    load_start, loads = load_text(), [load_1min()]
    silent, silent_url = _listen(_silent)
    late, late_url = _listen(_late)
    huge, huge_url = _listen(_huge)
    probes: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("no OpenTelemetry sink", lambda: measure("-")),
        ("a receiver that accepts and never answers", lambda: measure(silent_url)),
        (f"a receiver that answers after {LATE_S:.0f} s", lambda: measure(late_url)),
        ("a receiver that answers with 300 MB", lambda: measure(huge_url)),
        ("no receiver (connection refused)", lambda: measure(_refused())),
        (
            "the job's store hung (its server stopped), router and collector on it",
            measure_hung_store,
        ),
    ]
    rows = []
    for name, run in probes:
        load = load_text()
        result = run()
        rows.append((name, result, load))
        loads.append(load_1min())
        print(name, result, file=sys.stderr)
    silent.close()
    late.close()
    huge.close()
    lines = result_header(
        "timer.close() against silent, late, huge and absent OTLP receivers and a hung store",
        command_line(),
    )
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_text()}",
        "- Timer: one process, windows of 5 steps, 10 steps; `OtelSink(export_timeout_s=60)`",
        *quiet_check(loads),
        "",
        f"| probe | close (s) | within {CLOSE_DEADLINE_S:.0f} s | peak memory growth in close "
        "(MB) | exit status | load at start |",
        "|---|---:|---|---:|---:|---|",
    ]
    for name, result, load in rows:
        if "close_s" not in result:
            lines.append(f"| {name} | - | no | - | {result['exit']:.0f} | {load} |")
            continue
        within = "yes" if result["close_s"] <= CLOSE_DEADLINE_S else "no"
        lines.append(
            f"| {name} | {result['close_s']:.2f} | {within} | {result['grown_mb']:.0f} | "
            f"{result['exit']:.0f} | {load} |"
        )
    lines += [
        "",
        "The silent receiver holds the sink's last export past the collector's 20 s share of the "
        "deadline: close() returns then and says so in one line, leaving the export to its "
        "daemon thread. An absent receiver's failed export is retried for the first 2 s of the "
        "close only. A receiver's answer is read up to 64 KiB. The hung store holds the "
        "collector's reads and the router's reconnect; each is left on its daemon thread at "
        "its share of the deadline.",
        "",
    ]
    text = "\n".join(lines)
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
