"""DataLoader workers profiled while the router captures their rank, and their op diff.

``WorkerCapture`` is RankCapture's companion: when a capture starts (training thread) it asks the
workers of the loader ``timer.iter`` watches to run their batches under cProfile
(``record.loader_workers.WorkerProfiler``); when it stops it asks them to stop; at the trace's
export (router thread) it copies each worker's profile into the incident folder
(``rank<r>.worker<i>.prof``, readable with ``python -m pstats``) and writes their reduction,
``rank<r>.workers.json``: self time per function per batch, a builtin or library frame charged to
the user function that called it (``loader_support.py(17): slow_sample › <built-in method
time.sleep>``), as the trace op diff does.

On rank 0, ``worker_findings`` diffs the suspect's workers against the reference's and, with the
window's loader figures, says what to do in the loader's terms (``render.loader_text``).
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..analysis.schema import DATA_STAGE
from ..failures import say_failed
from ..formats.incident import incident_window
from ..formats.packet import atomic_file, write_bytes_atomically
from ..record.loader_workers import PROFILE_NAME
from ..render.loader_text import loader_sentence

logger = logging.getLogger("stagefrontier")

WORKERS_FILE = "rank{rank}.workers.json"
PROFILE_FILE = "rank{rank}.worker{worker}.prof"
MAX_ROWS = 20
_NOT_USER = ("/site-packages/", "/lib/python3", "/stagefrontier/record/", "/stagefrontier/route/")
_MAX_DEPTH = 32

Key = tuple[str, int, str]


class WorkerCapture:
    """The capture hook of one rank (see the module doc). Never raises into its caller."""

    def __init__(self, timer: Any) -> None:
        self._timer = timer
        self._captures = 0
        self._counters: Any = None
        self._capture = 0

    def started(self) -> None:
        """Training thread, the capture's first step: the workers profile from now on."""
        counters = self._timer.loader_workers
        self._counters = counters
        if counters is None:
            return
        self._captures += 1
        self._capture = self._captures
        counters.set_capture(self._capture)

    def stopped(self) -> None:
        """Training thread, the capture ended or failed: the workers stop profiling."""
        if self._counters is not None:
            self._counters.set_capture(0)

    def exported(self, folder: Path, rank: int) -> None:
        """Router thread, after the trace's export: the workers' profiles and their reduction
        into ``folder``."""
        counters, self._counters = self._counters, None
        if counters is None:
            return
        try:
            _export(counters, self._capture, folder, rank)
        except Exception as exc:
            say_failed(
                logger,
                "exporting the DataLoader workers' profiles",
                exc,
                "the incident has no worker op diff",
            )


def _export(counters: Any, capture: int, folder: Path, rank: int) -> None:
    stats: dict[Key, Any] = {}
    for worker in range(counters.workers):
        source = Path(counters.scratch, PROFILE_NAME.format(capture=capture, worker=worker))
        if not source.exists():
            continue
        target = folder / PROFILE_FILE.format(rank=rank, worker=worker)
        with open(source, "rb") as profile, atomic_file(target) as copy:  # whole or not at all
            shutil.copyfileobj(profile, copy)
        source.unlink(missing_ok=True)
        with target.open("rb") as f:
            _add_stats(stats, marshal.load(f))
    batches = fetches(stats)
    summary = {
        "rank": rank,
        "workers": counters.workers,
        "batches": batches,
        "functions": worker_rows(stats, batches),
    }
    text = json.dumps(summary, indent=1)
    write_bytes_atomically(folder / WORKERS_FILE.format(rank=rank), text.encode())


def fetches(stats: dict[Key, Any]) -> int:
    """Batches a profile covers: the calls of the DataLoader fetcher's ``fetch``."""
    return sum(
        value[1]
        for key, value in stats.items()
        if key[2] == "fetch" and key[0].replace("\\", "/").endswith("data/_utils/fetch.py")
    )


def _add_stats(into: dict[Key, Any], stats: dict[Key, Any]) -> None:
    """Several workers' stats in one: times and counts add (callers too)."""
    for key, (cc, nc, tt, ct, callers) in stats.items():
        if key not in into:
            into[key] = (cc, nc, tt, ct, dict(callers))
            continue
        c0, n0, t0, ct0, callers0 = into[key]
        for caller, numbers in callers.items():
            old = callers0.get(caller)
            callers0[caller] = (
                numbers if old is None else tuple(a + b for a, b in zip(old, numbers, strict=True))
            )
        into[key] = (c0 + cc, n0 + nc, t0 + tt, ct0 + ct, callers0)


def is_user(key: Key) -> bool:
    path = key[0].replace("\\", "/")
    return not (path == "~" or path.startswith("<") or any(p in path for p in _NOT_USER))


def function_name(key: Key) -> str:
    path, line, name = key
    return name if path == "~" else f"{os.path.basename(path)}({line}): {name}"


def worker_rows(stats: dict[Key, Any], batches: int) -> list[dict[str, Any]]:
    """Self time per user function (a builtin's or library frame's charged to the user function
    that called it), per batch, largest first."""
    total: dict[str, float] = {}
    calls: dict[str, int] = {}

    def add(key: str, seconds: float, count: int) -> None:
        total[key] = total.get(key, 0.0) + seconds
        calls[key] = calls.get(key, 0) + count

    for key, (_, nc, tt, _, callers) in stats.items():
        if tt <= 0:
            continue
        if is_user(key) or not callers:
            add(function_name(key), tt, nc)
            continue
        for caller, (_, c_nc, c_tt, _) in callers.items():
            owner = _user_caller(stats, caller)
            name = function_name(key)
            add(f"{function_name(owner)} › {name}" if owner else name, c_tt, c_nc)
    per = max(batches, 1)
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "ms_per_batch": round(seconds / per * 1e3, 4),
            "ms_per_call": round(seconds / max(calls[name], 1) * 1e3, 4),
            "calls_per_batch": round(calls[name] / per, 3),
        }
        for name, seconds in total.items()
    ]
    rows.sort(key=lambda r: (-float(r["ms_per_batch"]), str(r["name"])))
    return rows[:MAX_ROWS]


def _user_caller(stats: dict[Key, Any], key: Key) -> Key | None:
    """``key`` if it is the user's, else its costliest caller's user function, upwards."""
    seen: set[Key] = set()
    while key not in seen and len(seen) < _MAX_DEPTH:
        if is_user(key):
            return key
        seen.add(key)
        callers = stats.get(key, (0, 0, 0.0, 0.0, {}))[4]
        if not callers:
            return None
        key = max(callers, key=lambda c: callers[c][3])
    return None


# ------------------------------------------------------------------ rank 0
def read_workers(folder: Path, rank: int | None) -> dict[str, Any] | None:
    if rank is None:
        return None
    path = folder / WORKERS_FILE.format(rank=rank)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("functions"), list) else None


def worker_op_diff(
    suspect: dict[str, Any], reference: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The suspect's worker functions against the reference's, by time per batch."""
    theirs = {r["name"]: r for r in (reference or {}).get("functions", [])}
    rows = []
    for row in suspect["functions"]:
        other = theirs.get(row["name"], {})
        rows.append(
            {
                "name": row["name"],
                "suspect_ms_per_batch": row["ms_per_batch"],
                "reference_ms_per_batch": other.get("ms_per_batch", 0.0),
                "suspect_ms_per_call": row["ms_per_call"],
                "reference_ms_per_call": other.get("ms_per_call", 0.0),
                "calls_per_batch": row["calls_per_batch"],
            }
        )
    rows.sort(key=lambda r: (-(r["suspect_ms_per_batch"] - r["reference_ms_per_batch"]), r["name"]))
    return rows


def worker_findings(
    incident: dict[str, Any], records: Iterable[dict[str, Any]], min_share: float
) -> None:
    """Add the workers' op diff and the loader's advice (from the windows' ``records``: the
    live ones, or ``windows.jsonl`` after the run) to a captured incident, in place, and
    confirm a data wait the traces could not (``confirm_by_workers``); nothing when the suspect
    rank's workers were not profiled."""
    files = incident["trace_files"]
    suspect, reference = incident["leader_rank"], incident["reference_rank"]
    if str(suspect) not in files:
        return
    folder = Path(files[str(suspect)]).parent
    mine = read_workers(folder, suspect)
    if mine is None:
        return
    theirs = read_workers(folder, reference) if reference != suspect else None
    rows = worker_op_diff(mine, theirs)
    incident["worker_op_diff"] = rows
    figures = _figures(records, incident, suspect)
    incident["loader"] = figures or None
    slow = _function_of(rows[0]["name"]) if rows else ""
    advice = loader_sentence(figures, suspect, slow) if figures else ""
    if advice:
        incident["loader_advice"] = advice[0].upper() + advice[1:]
    confirm_by_workers(incident, rows, int(figures.get("workers", 0)), min_share)


def confirm_by_workers(
    incident: dict[str, Any], rows: list[dict[str, Any]], workers: int, min_share: float
) -> None:
    """Confirm a data-wait incident that its traces left unconfirmed when the suspect's
    DataLoader workers show the stall themselves. Workers hand over their batches in bursts, and
    a capture changes the pace of the steps it records, so the main thread's wait, the live
    evidence, can be missing from a handful of captured steps while the workers are still slow.
    Their own profile holds it: confirmed when the function that grew most takes, per batch and
    divided among the ``workers``, at least ``min_share`` of the usual step more on the suspect
    than on the reference (the trigger's own materiality floor)."""
    step_ms = incident.get("baseline_step_ms")
    if incident.get("confirmed") is not False or incident["stage"] != DATA_STAGE or not rows:
        return
    if not step_ms or workers < 1:
        return
    top = rows[0]
    mine, theirs = top["suspect_ms_per_batch"], top["reference_ms_per_batch"]
    per_step = (mine - theirs) / workers
    if per_step < min_share * step_ms:
        return
    capture_ms = incident.get("capture_step_ms")
    captured = f" ({capture_ms:.1f} ms a step during the capture)" if capture_ms else ""
    incident["confirmed"] = True
    incident["reasons"].append(
        f"confirmed by the DataLoader workers' profile: `{top['name']}` takes {mine:.1f} ms per "
        f"batch on rank {incident['leader_rank']} against {theirs:.1f} ms on rank "
        f"{incident['reference_rank']}, {per_step:.1f} ms per step among its {workers} workers "
        f"(at least {min_share:.0%} of the usual {step_ms:.1f} ms step), though the main "
        f"thread's wait did not stand out in the captured steps{captured}"
    )


def _figures(
    records: Iterable[dict[str, Any]], incident: dict[str, Any], rank: int
) -> dict[str, Any]:
    """The suspect's loader figures in the incident's window, of its attempt in the output
    folder (its id names both: ``formats.incident.incident_window``; a job resumed into the
    folder counts its windows from 0 again), else the latest that has them; the records read
    one at a time (``windows.jsonl`` of any length after the run)."""
    named = incident_window(incident["id"]) if incident.get("window") is not None else None
    found: dict[str, Any] = {}
    for record in records:
        figures = record.get("loader_workers", {}).get(str(rank))
        if isinstance(figures, dict) and "per_batch_s" in figures:
            found = figures
            if named is not None and (record.get("attempt", 0), record.get("window")) == named:
                break
    return found


def _function_of(name: str) -> str:
    """``slow_sample`` from ``loader_support.py(17): slow_sample › <built-in ...>``."""
    head = name.split(" › ")[0]
    return head.split("): ", 1)[1] if "): " in head else head
