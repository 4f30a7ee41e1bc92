"""The output folder's disk budget: what stays when the folder outgrows it.

Every window keeps its record in ``windows.jsonl`` (its report); the packet beside it (the
window's steps x ranks x stages durations: its detail) is what a long run gives up first, then
the detail of old healthy windows' records. When the folder passes its budget, it is compacted,
oldest first, until it is back under ``LOW_WATER`` of the budget, in this order:

1. the packets of unflagged windows outside the sample (one window in ``sample_every``, by
   index), leaving the newest ``RECENT`` packets, and every packet of a window the live
   regression check flagged or an incident was opened on;
2. while still over, the records of old healthy windows are cut down to what a run's summary
   reads of them (``sinks.record_compaction``; flagged and incident windows, those the
   profiler router worked in and the newest ``RECENT`` stay whole);
3. while still over, the sample is halved (``sample_every`` doubles) and step 1 runs again;
4. while still over, what is left of the sample, then the packets of flagged windows, oldest
   first: those flagged as a slowdown of the whole job (a busy machine: no rank's packet
   shows its cause) before those of a stage or rank regression (the newest ``RECENT`` and the
   incidents' windows kept; incidents are never deleted).

Each compaction appends one line to ``compacted.jsonl``: when, the budget, the folder's bytes
before and after, the sample kept, the windows whose packets it deleted and those whose
records it cut (``attempt/window`` ranges). The first compaction is said in one log line; a
folder that its records' summaries and incidents alone hold over budget is said once too
(nothing more can go without losing windows), and is compacted again only once it has grown by
a tenth of its budget. A rewrite of ``windows.jsonl`` that fails (a full disk), or a packet
that cannot be deleted, is said once; the compaction goes on without it and lists what it
deleted. The copy a killed rewrite left is
removed before the folder is first measured.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..environment import MiB
from ..failures import say_failed
from ..formats.compacted import COMPACTED_FILE, window_ranges
from ..formats.incident import incident_window
from ..formats.packet import remove_temporaries
from ..formats.records import WINDOWS_FILE
from .record_compaction import Order, compact_records

logger = logging.getLogger("stagefrontier")

LOW_WATER = 0.9
"""A compaction deletes until the folder holds at most this fraction of its budget, so it runs
once per many windows rather than at every window past the budget."""
RECENT = 8
"""The newest packets a compaction never deletes."""
FIRST_SAMPLE = 10
"""One unflagged window in this many keeps its packet at the first compaction."""
REMEASURE_EVERY = 64
"""Writes between two walks of the folder (the router's incidents are written beside)."""

_PACKET_NAME = re.compile(r"^(?:window|summary)-(\d+)(?:\.attempt-(\d+))?\.json$")


@dataclass
class HeldPacket:
    """A packet the folder holds: its window (attempt, index), size and what the regression
    check flagged it as (``flag_level``)."""

    path: Path
    order: tuple[int, int]
    size: int
    level: int

    @property
    def flagged(self) -> bool:
        return self.level > 0


class DiskBudget:
    """Keeps ``folder`` within ``budget`` bytes by deleting packets (see the module doc)."""

    def __init__(self, folder: Path, budget: int) -> None:
        self.folder = folder
        self.budget = budget
        self.sample_every = FIRST_SAMPLE
        self._bytes: int | None = None
        self._packets: dict[str, HeldPacket] | None = None
        """Every packet of the folder by name, read from the folder at the first compaction."""
        self._new: dict[str, HeldPacket] = {}
        """The packets this process wrote before the first compaction."""
        self._writes = 0
        self._over_at = 0
        """When the last compaction could not get the folder under its budget: the bytes past
        which the next one runs (what it left plus the room a compaction makes), else 0."""
        self._recent: deque[Order] = deque(maxlen=RECENT)
        """The newest records this process wrote, which stay whole."""
        self.records_rewrites = 0
        """How often ``windows.jsonl`` was rewritten (its writer then opens the new file)."""
        self._said: set[tuple[str, str]] = set()
        self._told_compacting = False
        self._told_over = False

    def written(self, record: dict[str, Any] | None, path: Path, size: int) -> None:
        """Count a file of ``size`` bytes just written (a packet of ``record``'s window, or a
        line of a file), then compact when the folder is over its budget. Never raises: a
        compaction that fails is said in one line and tried again at a later window."""
        if record is not None and path.parent.name == "packets":
            held = HeldPacket(path, _order(record), size, flag_level(record))
            (self._new if self._packets is None else self._packets)[path.name] = held
        elif record is not None and path.name == WINDOWS_FILE:
            self._recent.append(_order(record))
        self._writes += 1
        if self._bytes is None:  # before this process's first compaction: an earlier rewrite's
            remove_temporaries(self.folder, f".{WINDOWS_FILE}.*.tmp")  # interrupted copy
        if self._bytes is None or self._writes % REMEASURE_EVERY == 0:
            self._bytes = folder_bytes(self.folder)
        else:
            self._bytes += size
        if self._bytes <= max(self.budget, self._over_at):
            return
        try:
            self._compact()
        except OSError as exc:
            say_failed(logger, "compacting the output folder", exc, "tried again later", self._said)

    def _compact(self) -> None:
        before = self._bytes = folder_bytes(self.folder)
        packets = self._held()
        target = int(self.budget * LOW_WATER)
        incidents = self._incident_windows()
        kept = {name for name, _ in _newest(packets, RECENT)}
        kept |= {name for name, held in packets.items() if held.order in incidents}
        dropped = self._drop(packets, kept, level=0, target=target)
        cut: list[Order] = []
        if self._bytes > target:
            try:
                cut = self._cut_records(incidents)
            except OSError as exc:  # a full disk, say: the records stay whole, the rest goes on
                say_failed(
                    logger,
                    f"rewriting {WINDOWS_FILE} to cut old records",
                    exc,
                    "its records stay whole, tried again at the next compaction",
                    self._said,
                )
        while self._bytes > target and self._thinner(packets, kept):
            dropped += self._drop(packets, kept, level=0, target=target)
        if self._bytes > target:  # the sample's last windows (index 0), then the flagged
            for level in (0, WHOLE_JOB_LEVEL, STAGE_LEVEL):
                dropped += self._drop(packets, kept, level=level, target=target, sample=False)
        self._record(before, dropped, cut)

    def _drop(
        self,
        packets: dict[str, HeldPacket],
        kept: set[str],
        *,
        level: int,
        target: int,
        sample: bool = True,
    ) -> list[HeldPacket]:
        """Delete the packets of flag ``level`` oldest first until the folder is at ``target``
        (unflagged ones only outside the sample, unless not ``sample``); never those in
        ``kept``."""
        dropped = []
        for name, held in sorted(packets.items(), key=lambda item: item[1].order):
            if self._bytes is None or self._bytes <= target:
                break
            if name in kept or held.level != level:
                continue
            if not level and sample and held.order[1] % self.sample_every == 0:
                continue
            try:
                held.path.unlink(missing_ok=True)
            except OSError as exc:  # kept: the compaction goes on and lists what it deleted
                say_failed(logger, "deleting a packet", exc, "it is kept", self._said)
                kept.add(name)
                continue
            del packets[name]
            self._bytes -= held.size
            dropped.append(held)
        return dropped

    def _thinner(self, packets: dict[str, HeldPacket], kept: set[str]) -> bool:
        """Halve the sample; False when that would free no packet (none unflagged is left
        outside ``kept`` but the windows of index 0)."""
        thinner = self.sample_every * 2
        if not any(
            not held.flagged and name not in kept and held.order[1] % thinner
            for name, held in packets.items()
        ):
            return False
        self.sample_every = thinner
        return True

    def _held(self) -> dict[str, HeldPacket]:
        """The folder's packets: those on disk (earlier attempts' flagged from their records),
        with this process's own; read once."""
        if self._packets is None:
            levels = _flag_levels(self.folder / WINDOWS_FILE)
            self._packets = {}
            for path in sorted((self.folder / "packets").glob("*.json")):
                match = _PACKET_NAME.match(path.name)
                if match is None:
                    continue
                order = (int(match[2] or 0), int(match[1]))
                size = path.stat().st_size
                self._packets[path.name] = HeldPacket(path, order, size, levels.get(order, 0))
            for name, held in self._new.items():
                if name in self._packets:
                    self._packets[name] = held
            self._new = {}
        return self._packets

    def _incident_windows(self) -> set[Order]:
        """The windows an incident was opened on (attempt, window)."""
        named = (incident_window(p.name) for p in (self.folder / "incidents").glob("w*"))
        return {window for window in named if window is not None}

    def _cut_records(self, keep: set[Order]) -> list[Order]:
        """Cut the records of old healthy windows down to their summary
        (``sinks.record_compaction``), all but the newest ``RECENT`` this process wrote."""
        if not self._recent:
            return []
        cut, freed = compact_records(self.folder / WINDOWS_FILE, keep, min(self._recent))
        self.records_rewrites += 1
        if self._bytes is not None:
            self._bytes -= freed
        return cut

    def _record(self, before: int, dropped: list[HeldPacket], cut: list[Order]) -> None:
        after = self._bytes or 0
        over = after > self.budget
        line = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "budget_bytes": self.budget,
            "bytes_before": before,
            "bytes_after": after,
            "sample_every": self.sample_every,
            "packets_dropped": len(dropped),
            "windows": window_ranges(sorted(h.order for h in dropped if not h.flagged)),
            "flagged_windows": window_ranges(sorted(h.order for h in dropped if h.flagged)),
            "records_cut": len(cut),
            "records": window_ranges(sorted(cut)),
            "over_budget": over,
        }
        data = (json.dumps(line) + "\n").encode("utf-8")
        with open(self.folder / COMPACTED_FILE, "ab") as handle:
            handle.write(data)
        self._bytes = after + len(data)
        self._over_at = self._bytes + self.budget - int(self.budget * LOW_WATER) if over else 0
        if not self._told_compacting and (dropped or cut):
            self._told_compacting = True
            logger.info(
                "stagefrontier: %s reached its disk budget (%.1f MiB): packets of older "
                "windows are deleted and their records cut to a summary (flagged windows "
                "kept whole, and the packets of one in %d others), each compaction listed in %s",
                self.folder,
                self.budget / MiB,
                self.sample_every,
                COMPACTED_FILE,
            )
        if over and not self._told_over:
            self._told_over = True
            logger.warning(
                "stagefrontier: %s holds %.1f MiB, over its disk budget of %.1f MiB, in what "
                "is never deleted (records, incidents, the newest packets); raise "
                "STAGEFRONTIER_DISK_BUDGET_MB or disk_budget_mb",
                self.folder,
                after / MiB,
                self.budget / MiB,
            )


WHOLE_JOB_LEVEL, STAGE_LEVEL = 1, 2


def flag_level(record: dict[str, Any]) -> int:
    """What the live regression check flagged the record's window as: 0 nothing,
    ``WHOLE_JOB_LEVEL`` a slowdown of the whole job, ``STAGE_LEVEL`` a stage's or a rank's."""
    regression = record.get("regression")
    if not isinstance(regression, dict) or not regression:
        return 0
    return WHOLE_JOB_LEVEL if regression.get("kind") == "whole_job" else STAGE_LEVEL


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under ``folder`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # deleted meanwhile
                continue
    return total


def _order(record: dict[str, Any]) -> tuple[int, int]:
    return int(record.get("attempt", 0)), int(record["window"])


def _flag_levels(records: Path) -> dict[tuple[int, int], int]:
    """The ``flag_level`` of every record in ``records`` the regression check flagged, by
    (attempt, window)."""
    flagged: dict[tuple[int, int], int] = {}
    try:
        with open(records, "rb") as handle:
            for line in handle:
                if b'"regression": {' not in line:
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict) and flag_level(record):
                    flagged[_order(record)] = flag_level(record)
    except FileNotFoundError:
        pass
    return flagged


def _newest(packets: dict[str, HeldPacket], count: int) -> list[tuple[str, HeldPacket]]:
    return sorted(packets.items(), key=lambda item: item[1].order)[-count:]
