"""What a run keeps in its output folder besides each window: its attempts, and its disk budget.

One ``OutputFolder`` is shared by a collector's ``JsonlSink`` and ``PacketSink``. It does two
things for them.

Attempts. A job that torchrun restarts, or that is resumed from a checkpoint into the folder of
an earlier run, continues that folder: its windows count from 0 again, so each process's windows
carry the folder's next attempt number (``attempt`` in the record and the packet's name),
never an earlier one, and no window is overwritten. Under torchrun the attempt is the restart
count unless the folder already holds that attempt. ``attempts.jsonl`` gets one line when an
attempt writes its first window and one when it closes, with its run id, restart count, windows
and step range (an attempt that died has no closing line; its records give its range).

Budget. The folder holds at most ``budget`` bytes (``disk_budget``); past it, the packets of
older windows are compacted away (``sinks.disk_budget``), each compaction listed in
``compacted.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..environment import current_attempt, disk_budget_bytes
from ..formats.compacted import COMPACTED_FILE
from ..formats.records import WINDOWS_FILE
from ..window.merged import AnalyzedWindow
from .disk_budget import DiskBudget

logger = logging.getLogger("stagefrontier")

ATTEMPTS_FILE = "attempts.jsonl"
_FOLDERS: dict[str, OutputFolder] = {}
"""The output folder of every path a sink of this process wrote to (see ``shared_folder``)."""
_LOCK = threading.Lock()


def shared_folder(out_dir: str | os.PathLike[str], budget_bytes: int | None = None) -> OutputFolder:
    """The ``OutputFolder`` of ``out_dir`` for this process: one per folder, so that every sink
    writing there counts one attempt and one budget. ``budget_bytes`` (when given) sets its
    budget."""
    key = os.path.realpath(out_dir)
    with _LOCK:
        folder = _FOLDERS.get(key)
        if folder is None:
            folder = _FOLDERS[key] = OutputFolder(out_dir)
    if budget_bytes is not None:
        folder.budget.budget = budget_bytes
    return folder


class OutputFolder:
    """The attempt numbering and the disk budget of one output folder (see the module doc);
    its sinks get it from ``shared_folder``. The budget starts as
    ``STAGEFRONTIER_DISK_BUDGET_MB``."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.path = Path(out_dir)
        self.budget = DiskBudget(self.path, disk_budget_bytes())
        self.attempt: int | None = None
        """This process's attempt in the folder, set at its first window (or when the router
        names an incident before it: ``claim_attempt``)."""
        self._started = False
        self._steps: tuple[int, int] | None = None
        self._windows = 0
        self._lock = threading.Lock()

    def claim_attempt(self, restart_count: int) -> int:
        """This process's attempt in the folder: the one its windows have or will have. The
        first to ask (the first window's sinks, or the router naming an incident before any
        window) decides it, once, so both name the same attempt whichever comes first."""
        with self._lock:
            if self.attempt is None:
                self.attempt = next_attempt(self.path, restart_count)
            return self.attempt

    def stamp(self, window: AnalyzedWindow) -> dict[str, Any]:
        """The window's record, its ``attempt`` set to this process's attempt in the folder
        (the record is shared: the sinks after this one see the same attempt)."""
        record = window.record
        attempt = self.claim_attempt(int(record.get("attempt", 0)))
        if not self._started:
            self._started = True
            self._note({"attempt": attempt, "event": "start", **_who()})
        if record.get("attempt") != attempt:
            record["attempt"] = attempt
        return record

    def written(self, record: dict[str, Any], path: Path, size: int) -> None:
        """Count ``size`` bytes just written to ``path`` for ``record``'s window, and compact
        the folder when it is over its budget."""
        if path.name == WINDOWS_FILE:
            first = self._steps[0] if self._steps else int(record["first_step"])
            self._steps = (first, int(record["last_step"]))
            self._windows += 1
        self.budget.written(record, path, size)

    def close(self) -> None:
        """Write the attempt's closing line (once, and only when it wrote a window); a later
        window of this process starts the folder's next attempt."""
        if self.attempt is not None and self._steps is not None:
            first, last = self._steps
            self._note(
                {
                    "attempt": self.attempt,
                    "event": "end",
                    "windows": self._windows,
                    "first_step": first,
                    "last_step": last,
                    "time": _now(),
                }
            )
        self.attempt, self._started, self._steps, self._windows = None, False, None, 0

    def _note(self, line: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(line) + "\n").encode("utf-8")
        with open(self.path / ATTEMPTS_FILE, "ab") as handle:
            handle.write(data)
        self.budget.written(None, self.path / ATTEMPTS_FILE, len(data))


def clear_run_files(folder: str | os.PathLike[str]) -> None:
    """Delete what the file sinks of an earlier run wrote into ``folder`` (``windows.jsonl``,
    ``attempts.jsonl``, ``compacted.jsonl``, ``packets/``), for a caller that starts a new run
    there rather than continuing it (the demo)."""
    path = Path(folder)
    for name in (WINDOWS_FILE, ATTEMPTS_FILE, COMPACTED_FILE):
        (path / name).unlink(missing_ok=True)
    shutil.rmtree(path / "packets", ignore_errors=True)


def next_attempt(folder: Path, restart_count: int) -> int:
    """The attempt a process with torchelastic's ``restart_count`` takes in ``folder``: its
    restart count, or one past the folder's last attempt when the folder already holds that
    one or a later one (a job resumed into the folder of an earlier run)."""
    held = held_attempts(folder)
    if not held or restart_count > max(held):
        return restart_count
    return max(held) + 1


def held_attempts(folder: Path) -> set[int]:
    """The attempts the folder holds windows or attempt lines of: from ``attempts.jsonl``, and
    from ``windows.jsonl`` for a folder an earlier version wrote (which has no attempts file)."""
    attempts = folder / ATTEMPTS_FILE
    source = attempts if attempts.exists() else folder / WINDOWS_FILE
    held: set[int] = set()
    try:
        with open(source, "rb") as handle:
            for line in handle:
                held.add(_attempt_of(line))
    except FileNotFoundError:
        pass
    held.discard(-1)
    return held


def _attempt_of(line: bytes) -> int:
    """The ``attempt`` of one JSON line (0 when it has none), -1 for a line that is not JSON
    (a record a full disk cut short)."""
    try:
        value = json.loads(line).get("attempt", 0)
    except (ValueError, AttributeError, RecursionError):
        return -1
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _who() -> dict[str, Any]:
    run_id, restart = current_attempt()
    return {
        "run_id": run_id,
        "restart_count": restart,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": _now(),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
