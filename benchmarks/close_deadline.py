"""How long ``timer.close()`` takes on rank 0 when its OpenTelemetry sink meets a receiver
that never answers, one that answers late, one that answers with 300 MB, or none at all, next
to a timer without the sink; when the job's store hangs under its collector and profiler
router; on rank 0 with incidents written and a capture running; and on a member of a node whose
leader was killed (issue 37, items 5 to 7).

Each OTLP probe trains a timer of windows of 5 steps for 10 steps in a process of its own,
against a socket server on loopback run by this script. The store probe trains a timer
collecting through a real TCP store, with a profiler router polling it, for 10 steps; the
store's server (a process of its own) is then stopped (SIGSTOP: its port still accepts
connections, nothing answers) and the timer trains 10 steps more and closes. The incidents
probe is rank 0 of a one-rank job with a profiler router, three manual incidents written and a
fourth capture running at close. The dead leader probe is a 2 x 2 Gloo job collecting
hierarchically whose node 1 leader kills itself (SIGKILL) mid-run; its row is node 1's member,
and the slowest survivor is said below the table. Each row reports
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
from store_rank import STORE_RANK

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
STORE_PROBE = (
    STORE_RANK
    + """\
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
)
INCIDENTS = 3
INCIDENTS_PROBE = """\
import json, resource, sys, time
from datetime import timedelta
import torch.distributed as dist
from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

store = dist.TCPStore(
    "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
)
router = ProfilerRouter(steps=3, store=store, max_captures=4)
collection = CollectConfig("local", out_dir=sys.argv[1], regression=None, log=False)
timer = StageTimer(
    config=TimerConfig(stages=["data.next_wait"], window=5, collection=collection, router=router)
)
coordinator = router._attached.runtime.coordinator


def step():
    with timer.step(), timer.stage("data.next_wait"):
        time.sleep(0.01)


for _ in range(10):
    step()
for k in range(3):  # each incident written before the next is asked for
    router.request_capture([0])
    end = time.monotonic() + 120
    while (coordinator.captures <= k or coordinator.open is not None) and time.monotonic() < end:
        step()
router.request_capture([0])  # one more, running as the timer closes
end = time.monotonic() + 120
while timer._router.capture._prof is None and time.monotonic() < end:
    step()
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
timer.close()
close_s = time.monotonic() - started
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"close_s": close_s, "grown_mb": grown / 1024}))
"""
"""Rank 0 of a one-rank job with a profiler router: three manual incidents written during the
run (their pages wait for their figures) and a fourth capture running as it closes (issue 37,
item 6: 3-5 s per incident, 32 s for three under load, when rank 0 drew the figures itself)."""
DEAD_LEADER_STEP = 15
"""The step at whose start node 1's leader (rank 2 of 2 nodes x 2 ranks) kills itself."""
MEMBER = 3
"""The member of that node whose close is measured."""


def dead_leader_rank(rank: int, folder: str, port: int) -> None:
    """One rank of a 2 x 2 job collecting hierarchically (issue 37, item 7): rank 2, node 1's
    leader, dies by SIGKILL at ``DEAD_LEADER_STEP``; the others train 30 steps more, then
    close, each writing its close time to ``close-rank<r>.json``."""
    import resource

    os.environ.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2))
    import torch.distributed as dist

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    store = dist.TCPStore("127.0.0.1", port, 4, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4)
    collection = CollectConfig("hierarchical", out_dir=folder, timeout_s=2.0, regression=None)
    timer = StageTimer(
        config=TimerConfig(stages=["data.next_wait"], window=5, collection=collection)
    )
    for step in range(DEAD_LEADER_STEP + 30):
        if rank == 2 and step == DEAD_LEADER_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.02)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    timer.close()
    close_s = time.monotonic() - started
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    with open(os.path.join(folder, f"close-rank{rank}.json"), "w") as out:
        json.dump({"close_s": close_s, "grown_mb": grown}, out)
    dist.destroy_process_group()


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


def measure_incidents() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", INCIDENTS_PROBE, out],
            capture_output=True,
            text=True,
            timeout=CLOSE_DEADLINE_S + 600,
        )
    return _result(done.returncode, done.stdout)


def measure_dead_leader() -> dict[str, float]:
    """Node 1's member's close, its leader killed mid-run (the slowest of the survivors is
    ``slowest_s``)."""
    from stagefrontier.demo.launch import run_ranks

    with tempfile.TemporaryDirectory() as out:
        codes = run_ranks(dead_leader_rank, 4, out, deadline_s=600.0, may_die=(2,))
        closes = {}
        for rank in (0, 1, MEMBER):
            with open(os.path.join(out, f"close-rank{rank}.json")) as kept:
                closes[rank] = json.load(kept)
    result = dict(closes[MEMBER])
    result["slowest_s"] = max(c["close_s"] for c in closes.values())
    result["exit"] = max(codes[r] or 0 for r in (0, 1, MEMBER))
    return result


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
                [sys.executable, "-c", STORE_PROBE, "0", "1", port, out, "0.001"],
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
        (
            f"rank 0 with {INCIDENTS} incidents written and a capture running (item 6)",
            measure_incidents,
        ),
        (
            f"rank {MEMBER}, its node's leader killed mid-run, 2 nodes x 2 ranks (item 7)",
            measure_dead_leader,
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
        "timer.close() against silent, late, huge and absent OTLP receivers, a hung store, "
        "pending incidents and a dead node leader",
        command_line(),
    )
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_text()}",
        "- Timer: windows of 5 steps; OTLP probes: one process, 10 steps, "
        "`OtelSink(export_timeout_s=60)`",
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
        "its share of the deadline. Rank 0's incidents have their pages' figures drawn by a "
        "process of its own after the run, and the capture still running is stopped and "
        "exported within the router's share. A member of a dead node leader finds the node's "
        "store gone at its next send (a plain TCP probe of the address first, no 10 s connect "
        "tries), says so once, keeps its own windows from then on, and closes without waiting "
        "on the dead store.",
        "",
    ]
    for _name, result, _load in rows:
        if "slowest_s" in result:
            lines += [
                f"In the dead leader's job, the slowest of the three surviving ranks' closes took "
                f"{result['slowest_s']:.2f} s.",
                "",
            ]
    text = "\n".join(lines)
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
