"""The committed real PyTorch Profiler traces the reducer tests read (``trace``; made by
tests/data/make_traces.py), and an independent slow reader of them: ``reference_matrix`` reads a
trace the slow, obvious way (for the tests' expected values).
"""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from stagefrontier.formats.incident import list_incidents

DATA = "data.next_wait"
FWD = "model.fwd_loss_cpu_wall"
BWD = "model.backward_cpu_wall"
CALLBACKS = "callbacks.cpu_wall"
OPTIM = "optim.step_cpu_wall"
OTHER = "step.other_cpu_wall"
TIMED = (DATA, FWD, BWD, CALLBACKS, OPTIM)
STAGES = (*TIMED, OTHER)

WORLD = 2
SLOW_RANK = 1
DATA_SLEEP_S = 0.08
"""The Gloo job's shape: rank SLOW_RANK sleeps DATA_SLEEP_S in its data stage every step."""
THREE_RANGES = (DATA, FWD, BWD)
"""The stages with a range in ``three-ranges-4-steps.json`` (its data stage sleeps 30 ms)."""

TRACES = Path(__file__).parent / "data" / "traces"
"""The committed real traces, written by tests/data/make_traces.py (which says how each was
made): ``gloo-2-ranks/`` (one trace per rank, five profiled steps), ``single-4-steps.json``,
``single-3-steps.json``, ``slow-data-4-steps.json`` (30 ms data sleep),
``three-ranges-4-steps.json``, ``numbered-steps-3.json`` (``stagefrontier.step#N`` ranges, no
profiler steps) and ``bare-steps-3.json`` (``my.step`` ranges)."""


def trace(name: str) -> Path:
    """The committed trace (or folder of traces) ``name``; read it, never write into it."""
    path = TRACES / name
    assert path.exists(), f"{path} is missing: run tests/data/make_traces.py"
    return path


# --- independent reading ------------------------------------------------------------------------


def load_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data, data["traceEvents"]


def thread_trace(path: Path, events: list[tuple[str, str, float, float]]) -> Path:
    """A gzipped Kineto-like trace of complete events, each (category, name, ts µs, dur µs),
    all on one thread."""
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": c, "name": n, "ts": ts, "dur": dur, "pid": 1, "tid": 7}
            for c, n, ts, dur in events
        ]
    }
    with gzip.open(path, "wt") as handle:
        json.dump(trace, handle)
    return path


def write_events(path: Path, header: dict[str, Any], events: list[dict[str, Any]]) -> Path:
    data = {k: v for k, v in header.items() if k != "traceEvents"}
    data["traceEvents"] = events
    path.write_text(json.dumps(data))
    return path


def reference_matrix(path: Path, timed: tuple[str, ...] = TIMED) -> dict[int, np.ndarray]:
    """Step id -> [S] ns (residual last), from a trace read event by event: the step ranges are
    ``ProfilerStep#N``, a stage belongs to the step whose range holds its start, same thread."""
    _, events = load_events(path)
    complete = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    steps = {}
    for e in complete:
        match = re.fullmatch(r"ProfilerStep#(\d+)", e["name"])
        if match:
            steps[int(match.group(1))] = e
    out = {}
    for step_id, step in steps.items():
        start = round(step["ts"] * 1000)
        end = start + round(step["dur"] * 1000)
        row = []
        for name in timed:
            total = 0
            for e in complete:
                if e["name"] != name or e["tid"] != step["tid"]:
                    continue
                s = round(e["ts"] * 1000)
                if start <= s < end:
                    total += round(e["dur"] * 1000)
            row.append(total)
        row.append(max(end - start - sum(row), 0))
        out[step_id] = np.array(row, dtype=np.int64)
    return out


def manual_incident(out_dir: Path, index: int = 0) -> Path:
    """The folder of the run's ``index``-th manual incident, once settled (``settled_incidents``:
    a capture that settles as the timer closes, as on a busy machine, is reduced by the
    after-run process). Its id starts with the last window the router had analyzed when it
    served the request, which depends on timing."""
    settled_incidents(out_dir)
    found = sorted((Path(out_dir) / "incidents").glob(f"w*-manual{index}"))
    assert len(found) == 1, found
    return found[0]


AFTER_RUN_DEADLINE_S = 300.0
"""How long ``settled_incidents`` waits for the after-run process: generous, since it starts
Python and imports the reducers on a machine that may be busy."""


def settled_incidents(
    out_dir: Path, deadline_s: float = AFTER_RUN_DEADLINE_S
) -> list[dict[str, Any]]:
    """The run's incidents once none is left to the after-run process: an incident that
    settles as rank 0's timer closes is recorded ``reduced: "pending"`` and confirmed by a
    process of its own (``route.html.draw_later``), which may still run when the job's ranks
    have exited. Polls until that process has rewritten every such record (atomically), or
    the deadline passes; the records are returned as they are then."""
    end = time.monotonic() + deadline_s
    while True:
        incidents = list_incidents(out_dir)
        if all(i.get("reduced") != "pending" for i in incidents) or time.monotonic() > end:
            return incidents
        time.sleep(0.2)


FIGURES_LATER = "The figures are added to this page after the run"
"""What a live incident's page says until the after-run process has drawn its figures."""


def drawn_pages(out_dir: Path, deadline_s: float = AFTER_RUN_DEADLINE_S) -> dict[str, str]:
    """The run's incident pages (by incident) once the after-run process
    (``route.html.draw_later``) has rewritten every one, with its figures or a note saying
    why they are not drawn: until then the folder is still growing. Polls until then or the
    deadline; the pages are returned as they are then."""
    end = time.monotonic() + deadline_s
    while True:
        pages = {
            page.parent.name: page.read_text(encoding="utf-8")
            for page in sorted((Path(out_dir) / "incidents").glob("*/incident.html"))
        }
        if all(FIGURES_LATER not in text for text in pages.values()) or time.monotonic() > end:
            return pages
        time.sleep(0.2)
