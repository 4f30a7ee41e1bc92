"""How many of the library's modules the flow of a window and the flow of an incident run.

A profile hook on every thread of one process records each module of ``stagefrontier`` whose
functions are called. The process is a job of one rank: a Gloo process group around a real
c10d ``TCPStore``, so that the timer collects through the store as a distributed job's does.

* a window: while one window of a timer (two stages, four steps) is handed off through the
  store, analyzed and written to ``windows.jsonl`` with its log line (the timer built, and the
  self-cost meter calibrated, before recording starts);
* an incident: while the timer's ``ProfilerRouter`` captures one manually requested incident
  of three steps on its own rank and writes it (the windows the timer analyzes meanwhile
  included); Python stacks off, as the profiler's own stack recording replaces a profile hook
  on the training thread.

    python benchmarks/flow_modules.py

Beside the modules each flow runs: the modules ``docs/ARCHITECTURE.md`` draws on the flow's
path (``drawn_flows``), how many of them ran, and the drawn ones that did not run here, by
name; of the modules an incident runs, those a window's flow does not; and the modules the
flow loads: the same flow alone in a fresh process (the script run again with ``--loaded
FLOW``), every module of ``stagefrontier`` that the process imported by its end, the flow's
own imports from the package's top included. Counts, not times: the load average is recorded
only as the run's setting.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from drawn_flows import ARCHITECTURE, alternatives, drawn_modules, flows_from_doc
from harness_common import (
    command_line,
    load_text,
    result_header,
    script_parser,
    table,
    write_result,
)
from stagefrontier import CollectConfig, StageTimer, TimerConfig

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall")
PACKAGE = f"{os.sep}stagefrontier{os.sep}"


class ModulesCalled:
    """The modules of the package whose functions are called between ``start`` and the end of
    the ``with`` block, on any thread: the hook is set for new threads when the block opens
    (before the timer and its threads are built) and on this thread at ``start``."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._recording = False

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self._recording:
            path = frame.f_code.co_filename
            if PACKAGE in path and path.endswith(".py"):  # not the HTML pages' templates
                self.seen.add(path.split(PACKAGE, 1)[1].removesuffix(".py"))

    def start(self) -> None:
        self._recording = True
        sys.setprofile(self._hook)

    def __enter__(self) -> ModulesCalled:
        threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._recording = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def train(timer: StageTimer, steps: int) -> None:
    for _ in range(steps):
        with timer.step():
            with timer.stage(STAGES[0]):
                time.sleep(0.002)
            with timer.stage(STAGES[1]):
                sum(range(2000))


def wait_for(done: Callable[[], bool], timer: StageTimer | None = None) -> bool:
    """Whether ``done()`` came true within two minutes (the timer training on meanwhile)."""
    deadline = time.monotonic() + 120.0
    while not done() and time.monotonic() < deadline:
        if timer is not None:
            train(timer, 1)
        else:
            time.sleep(0.01)
    return done()


@functools.cache
def one_rank_job() -> Any:
    """The process's Gloo group of one rank around a real ``TCPStore`` (made once); its store."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return store


def window_flow(work: Path) -> set[str]:
    one_rank_job()
    collection = CollectConfig(mode="store", out_dir=work / "warm", log=False)
    warm = StageTimer(config=TimerConfig(stages=STAGES, window=4, collection=collection))
    train(warm, 4)  # the calibration and the imports, before recording
    warm.close()
    records = work / "window" / "windows.jsonl"
    with ModulesCalled() as called:
        collection = CollectConfig(mode="store", out_dir=work / "window", log=True)
        timer = StageTimer(config=TimerConfig(stages=STAGES, window=4, collection=collection))
        called.start()
        train(timer, 4)
        assert wait_for(lambda: records.exists() and records.read_text().count("\n") >= 1)
    timer.close()
    return called.seen


def incident_flow(work: Path) -> set[str]:
    from stagefrontier import ProfilerRouter

    store = one_rank_job()
    router = ProfilerRouter(steps=3, store=store, capture_timeout_s=30.0, with_stack=False)
    collection = CollectConfig("store", out_dir=work / "incident", regression=None, log=False)
    incidents = work / "incident" / "incidents"
    with ModulesCalled() as called:
        timer = StageTimer(config=TimerConfig(window=5, collection=collection, router=router))
        train(timer, 10)
        called.start()
        router.request_capture([0], stage=STAGES[0])
        written = wait_for(lambda: any(incidents.glob("*/incident.html")), timer)
    timer.close()
    assert written, "no incident was written"
    return called.seen


WINDOW = "a window"
FLOWS = {WINDOW: window_flow, "an incident": incident_flow}


def loaded_by(flow: str) -> int:
    """How many modules of the package a fresh process running only ``flow`` loads."""
    command = [sys.executable, __file__, "--loaded", flow]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return int(proc.stdout.split()[-1])


def main() -> None:
    parser = script_parser("flow_modules", __doc__)
    parser.add_argument("--loaded", choices=FLOWS, help="run FLOW alone, print the modules loaded")
    args = parser.parse_args()
    if args.loaded:
        with tempfile.TemporaryDirectory() as work:
            FLOWS[args.loaded](Path(work))
        print(len([m for m in sys.modules if m.split(".", 1)[0] == "stagefrontier"]))
        return
    loads = [load_text()]
    with tempfile.TemporaryDirectory() as work:
        flows = {name: flow(Path(work)) for name, flow in FLOWS.items()}
    loaded = {name: loaded_by(name) for name in FLOWS}
    loads.append(load_text())
    drawings = flows_from_doc(ARCHITECTURE.read_text(encoding="utf-8"))
    drawn = {name: drawn_modules(lines) for name, lines in drawings.items()}
    rows = []
    for name, seen in flows.items():
        floors = sorted({m.split("/", 1)[0] for m in seen if "/" in m})
        analysis = len([m for m in seen if m.startswith("analysis/")])
        ran = [m for m in drawn[name] if seen.intersection(alternatives(m))]
        own = "-" if name == WINDOW else len(seen - flows[WINDOW])
        row = (len(drawn[name]), len(ran), len(seen), own, analysis, ", ".join(floors))
        rows.append((name, *row, loaded[name]))
    lines = result_header("The modules each flow runs", command_line())
    lines += [f"- Load average (1/5/15 min) at start: {loads[0]}; at end: {loads[1]}", ""]
    header = ["flow", "modules drawn", "of them run", "modules run", "not in a window's"]
    lines += table([*header, "of them analysis/", "packages", "modules loaded"], rows)
    for name, seen in flows.items():
        absent = [m for m in drawn[name] if not seen.intersection(alternatives(m))]
        lines += ["", f"The flow of {name}, drawn: " + ", ".join(f"`{m}`" for m in drawn[name])]
        lines[-1] += f"; not run here: {', '.join(f'`{m}`' for m in absent) or 'none'}."
        lines += [
            "",
            f"The flow of {name}, run: " + ", ".join(f"`{m}`" for m in sorted(seen)) + ".",
        ]
    text = "\n".join(lines) + "\n"
    write_result(args.out, text)


if __name__ == "__main__":
    main()
