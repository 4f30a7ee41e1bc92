"""Benchmark: reading back a long run folder (10,000 to 100,000 windows) with ``report``,
``report --html``, ``plot`` and ``compare``: wall time and peak memory of each command.

A month of one-second steps at one window per 100 steps is about 26,000 windows. The script
makes such folders from a short real run: it runs the demo once (2 Gloo ranks, 10-step
windows, a data-loader fault from step 80 that the live regression check flags, the profiler
router on, so the folder holds real flagged windows and a real incident), then repeats that
run's windows and packets with new window indices and steps until the folder holds N windows.
Each record goes through the library's own ``windows.jsonl`` writer (``sinks.files.JsonlSink``)
and each packet through its own encoding (``formats.packet.packet_bytes``); only the first
repetition keeps its regressions and the profiler router's cost, so a long folder holds the
source run's few flagged windows, not some in every repetition. The incident folder is copied
as it is. The writer keeps the folder within the default disk budget (1024 MiB) as a live run's
does: past about 50,000 windows it deletes packets outside the sample and cuts old healthy
records to their summary (``sinks.disk_budget``); the results say what the folder then holds.

Each command then runs in a process of its own (``python -m stagefrontier.cli``), started by
a small launcher (``LAUNCHER``: a bare interpreter that imports nothing but the standard
library's ``subprocess`` and ``resource``) that reads the command's peak memory, its maximum
resident set size, from its own ``RUSAGE_CHILDREN``. Read from this script's process, the figure
would be wrong: Linux counts in a child's ``ru_maxrss`` the resident set it had before its
``exec``, which for a child forked from this script is this script's, grown to hundreds of MB
while it made the folder (every command read 287 MB that way). The launcher's own resident set
(about 10 MB) is the floor below which the figure is not the command's; the table gives it. The
launcher also times the command (wall clock, and its CPU time, user and system, beside: on a
shared machine the wall time grows with the other jobs' load, the CPU time much less).
``compare`` compares the folder's first half with its second half.

Usage::

    python benchmarks/long_run.py                       # 10k, 25k, 100k windows
    python benchmarks/long_run.py --windows 2000 --quick --out /tmp/long_run.md
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness_common import (
    command_line,
    environment,
    load_1min,
    load_text,
    quiet_check,
    result_header,
    script_parser,
    table,
    write_result,
)
from stagefrontier.formats.compacted import COMPACTED_FILE
from stagefrontier.formats.packet import Packet, packet_bytes, packet_name, read_packet
from stagefrontier.formats.records import COMPACTED_MARK, WINDOWS_FILE, read_records
from stagefrontier.sinks.files import JsonlSink

INCIDENTS = "incidents"
SIZES = (10_000, 25_000, 100_000)
TARGET_S, TARGET_MB = 60.0, 300.0
"""The targets for 100,000 windows on the project's 2-core machine."""
IDLE_ROUTER = {key: {"max": 0.0, "median": 0.0} for key in ("router_cpu_s", "capture_s")}
DEMO = ["--ranks", "2", "--steps", "120", "--window", "10", "--fault", "data@1:60ms,from=80"]


def source_run(work: Path) -> Path:
    """A short real run: the demo with a late data-loader fault and the profiler router."""
    out = work / "source"
    subprocess.run(
        [sys.executable, "-m", "stagefrontier.cli", "demo", *DEMO, "--router", "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def generate(source: Path, out: Path, windows: int) -> None:
    """``out`` holding ``windows`` windows: the source run's windows and packets repeated."""
    records = read_records(source / WINDOWS_FILE)
    packets = {
        (r.get("attempt", 0), r["window"]): read_packet(source / "packets" / packet_name(r))
        for r in records
    }
    steps = records[-1]["last_step"] + 1
    (out / "packets").mkdir(parents=True)
    if (source / INCIDENTS).is_dir():
        shutil.copytree(source / INCIDENTS, out / INCIDENTS)
    sink = JsonlSink(out)
    try:
        for i in range(windows):
            lap, record = divmod(i, len(records))
            base = records[record]
            shift = lap * steps
            facts: dict[str, Any] = {
                "window": i,
                "first_step": base["first_step"] + shift,
                "last_step": base["last_step"] + shift,
            }
            if lap:  # the live check's regressions and the router's work happened once
                facts["regression"] = None
                facts["self_cost"] = {**base["self_cost"], **IDLE_ROUTER}
            sink.write(SimpleNamespace(record={**base, **facts}))  # type: ignore[arg-type]
            packet: Packet = packets[(base.get("attempt", 0), base["window"])]
            meta = {**packet.meta, **facts}
            data = packet_bytes(replace(packet, meta=meta))
            (out / "packets" / packet_name(facts)).write_bytes(data)
    finally:
        sink.close()


LAUNCHER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
child = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open("/proc/self/status") as status:
    floor = next((int(l.split()[1]) for l in status if l.startswith("VmHWM:")), 0)
print(json.dumps({"code": child.returncode, "wall_s": wall,
                  "cpu_s": usage.ru_utime + usage.ru_stime, "peak_kb": usage.ru_maxrss,
                  "floor_kb": floor, "err": child.stderr[-400:].decode(errors="replace")}))
"""
"""Runs ``argv[1:]`` and prints its exit code, wall and CPU seconds and peak resident set (kB)
as JSON, with its own peak resident set (``floor_kb``), which the child's figure includes
(the child's resident set before its ``exec`` was this process's)."""


@dataclass
class Measured:
    wall_s: float
    cpu_s: float
    peak_mb: float
    floor_mb: float
    code: int


def folder_facts(folder: Path) -> str:
    """What a generated folder holds: its size, packets, records cut and compactions."""
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
    packets = sum(1 for _ in (folder / "packets").iterdir())
    with open(folder / WINDOWS_FILE, "rb") as handle:
        cut = sum(COMPACTED_MARK in line for line in handle)
    compacted = folder / COMPACTED_FILE
    compactions = len(compacted.read_text().splitlines()) if compacted.exists() else 0
    return (
        f"a folder of {size:.0f} MB, {packets:,} packets, {cut:,} records cut to their summary "
        f"by the disk budget in {compactions} compaction(s)"
    )


def measure(command: list[str]) -> Measured:
    """The wall and CPU seconds, the peak resident set and exit code of ``stagefrontier
    COMMAND``, read by the launcher that starts it (see the module doc)."""
    cli = [sys.executable, "-m", "stagefrontier.cli", *command]
    launched = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LAUNCHER, *cli], capture_output=True, check=True
    )
    facts = json.loads(launched.stdout)
    if facts["code"]:
        print(f"  {' '.join(command)}: exit {facts['code']}: {facts['err']}")
    return Measured(
        facts["wall_s"],
        facts["cpu_s"],
        facts["peak_kb"] / 1024,
        facts["floor_kb"] / 1024,
        facts["code"],
    )


def commands(folder: Path, windows: int) -> dict[str, list[str]]:
    half = windows // 2
    return {
        "report": ["report", str(folder)],
        "report --html": ["report", str(folder), "--html", str(folder / "report.html")],
        "plot": ["plot", str(folder)],
        "compare": ["compare", f"{folder}:0-{half - 1}", f"{folder}:{half}-"],
    }


def main() -> int:
    p = script_parser("long_run", __doc__, quick="no targets checked")
    p.add_argument("--windows", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--keep", type=Path, help="keep the generated folders here")
    p.add_argument("--source", type=Path, help="a short run's folder to repeat (default: a demo)")
    args = p.parse_args()
    loads = [load_1min()]
    machine = environment()  # its load line is read now, as the script starts
    rows: list[list[object]] = []
    failed = []
    held: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stagefrontier-long-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        source = args.source or source_run(work)
        for windows in args.windows:
            folder = work / f"run-{windows}"
            shutil.rmtree(folder, ignore_errors=True)
            start = time.perf_counter()
            generate(source, folder, windows)
            made = time.perf_counter() - start
            held.append(f"- {windows:,} windows: {folder_facts(folder)}, made in {made:.0f} s")
            print(held[-1])
            for name, command in commands(folder, windows).items():
                run = measure(command)
                loads.append(load_1min())
                extra = ""
                if name == "report --html":
                    extra = f"{(folder / 'report.html').stat().st_size / 1024:.0f} kB page"
                met = run.wall_s <= TARGET_S and run.peak_mb <= TARGET_MB
                if run.code or (not met and windows >= 100_000):
                    failed.append(f"{name} at {windows} windows")
                rows.append(
                    [
                        f"{windows:,}",
                        name,
                        f"{run.wall_s:.1f}",
                        f"{run.cpu_s:.1f}",
                        f"{run.peak_mb:.0f}",
                        f"{run.floor_mb:.0f}",
                        extra or "-",
                        "ok" if run.code == 0 else f"exit {run.code}",
                        f"{loads[-1]:.2f}" if loads[-1] is not None else "n/a",
                    ]
                )
                print("  " + " | ".join(str(c) for c in rows[-1]))
            if args.keep is None:
                shutil.rmtree(folder)
    lines = result_header("Reading back a long run folder", command_line())
    lines += machine
    lines += quiet_check(loads)
    lines += [
        f"- Load average (1/5/15 min) at the end: {load_text()}",
        "",
        "The folders read back:",
        "",
        *held,
        "",
        f"Targets for 100,000 windows: at most {TARGET_S:.0f} s and {TARGET_MB:.0f} MB per "
        "command. Peak memory is the command's maximum resident set size (Python, numpy and "
        "the CLI's imports included; matplotlib's for `plot` and `report --html`), read by a "
        "small launcher process that started it; the launcher's own resident set, which the "
        "figure cannot go below, is beside it. CPU s is the command's user and system time, "
        "which the machine's other jobs inflate much less than the wall time.",
        "",
        *table(
            [
                "windows",
                "command",
                "wall s",
                "CPU s",
                "peak RSS MB",
                "launcher MB",
                "page",
                "exit",
                "load (1 min)",
            ],
            rows,
        ),
        "",
        "Targets met." if not failed else "Targets missed: " + ", ".join(failed),
        "",
    ]
    write_result(args.out, "\n".join(lines), echo=False)
    return 1 if failed and not args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
