"""The offline front door: one analyzed window from whatever file or folder a user holds.

``load_window`` reads an ``.npz`` window, an evidence packet, a ``windows.jsonl`` record, an
output folder (its packet or record of one window), or a profiler trace reduced to the stage
matrix, and returns the report with what the input said about the window.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .analysis.window_report import WindowReport
from .errors import ReportFormatError
from .formats.limits import read_capped
from .formats.npz import load_npz
from .formats.packet import packet_from_dict, packet_json, packet_name
from .formats.records import (
    WINDOWS_FILE,
    record_meta,
    record_report,
    records_of_window,
    select_record,
)
from .formats.summary_packet import is_summary_packet, summary_packet_from_dict
from .reducers.detect import FORMATS, TRACE_FORMATS, detect_format, reduce_trace
from .reducers.options import TraceOptions
from .reducers.ranges import id_text

PACKETS_FOLDER = "packets"
PACKET_GLOB = "window-*.json"


@dataclass(frozen=True)
class LoadedWindow:
    """An analyzed input: the report, what the input said about the window (``meta``), the report
    a packet stored beside its matrix, and what reducing a trace noted."""

    report: WindowReport
    meta: dict[str, Any] | None = None
    stored_report: WindowReport | None = None
    notes: tuple[str, ...] = ()

    def facts(self) -> dict[str, Any]:
        """``meta`` cut to what fits one line: scalars, rank lists as ranges, the hosts by name,
        the lead scope; per-rank tables (pids, local ranks, probes) are left out."""
        return _one_line(self.meta or {})


def load_window(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    fmt: str = "auto",
    *,
    stages: Sequence[str] | None = None,
    trace: TraceOptions | None = None,
    steps: tuple[int, int] | None = None,
    window: int | None = None,
    attempt: int | None = None,
) -> LoadedWindow:
    """Analyze one window held in ``path``.

    Args:
        path: an ``.npz`` (arrays ``d [steps, ranks, stages]``, ``stages``, optional ``roles``);
            an evidence packet (re-analyzed with its stored gates, roles and side evidence); a
            ``windows.jsonl`` or an output folder (holding ``windows.jsonl`` and ``packets/``),
            or its ``packets/`` folder, with ``window`` naming the window; PyTorch Profiler traces
            (a file, or a folder of one file per rank), or Nsight Systems SQLite exports. A list
            of paths is read as traces of one window, one file (or folder) per rank.
        fmt: ``auto`` (told by content, then by name) or one of ``packet``, ``npz``, ``kineto``,
            ``hta``, ``nsys``.
        stages: traces only: the ordered stage names the ranges carry; None infers them.
        trace: traces only: how to reduce them (ranks, world size, step source, ...).
        steps: traces only: keep step ids ``first..last`` (inclusive).
        window: output folders and ``windows.jsonl``: which window. A folder's packet is
            re-analyzed; a ``windows.jsonl`` record holds the report only, which is returned as
            stored.
        attempt: with ``window``: the restart attempt, needed only when a restart repeats the
            index.

    Raises:
        ReportFormatError: an unreadable or unknown input, naming it; an output folder without
            ``window``, pointing to ``stagefrontier report``.
        TraceFormatError: a trace the reducers refuse.
        OSError: the path cannot be read.
    """
    if fmt not in FORMATS:
        raise ReportFormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if not isinstance(path, str | os.PathLike):
        paths = [Path(p) for p in path]
        if len(paths) != 1:
            return _load_traces(paths, fmt, stages, trace, steps, window)
        path = paths[0]
    source = Path(path)
    if fmt == "auto" and _is_output_folder(source):
        return _load_from_folder(source, window, attempt)
    kind = detect_format(source) if fmt == "auto" else fmt
    if kind == "windows":
        return _load_record(source, window, attempt)
    if window is not None:
        raise ReportFormatError(
            f"{source}: holds one window; a window index applies to output folders and "
            "windows.jsonl"
        )
    if kind in TRACE_FORMATS:
        return _load_trace(source, kind, stages, trace, steps)
    if source.is_dir():
        raise ReportFormatError(f"{source}: a folder; only traces can be read from a folder")
    if kind == "npz":
        return LoadedWindow(report=load_npz(source))
    return _load_packet(source)


def _load_traces(
    paths: list[Path],
    fmt: str,
    stages: Sequence[str] | None,
    options: TraceOptions | None,
    steps: tuple[int, int] | None,
    window: int | None,
) -> LoadedWindow:
    """Several paths: the traces of one window, read together (each rank's file or folder)."""
    if not paths:
        raise ReportFormatError("no path given")
    kinds = {p: detect_format(p) if fmt == "auto" else fmt for p in paths}
    others = [f"{p} ({kind})" for p, kind in kinds.items() if kind not in TRACE_FORMATS]
    if others or window is not None:
        raise ReportFormatError(
            "several paths are read together only as the traces of one window, one per rank; "
            + (f"not a trace: {', '.join(others)}" if others else "a window index does not apply")
        )
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        raise ReportFormatError(
            f"the paths hold traces of different kinds ({', '.join(found)}); give one kind"
        )
    return _load_trace(paths, found[0], stages, options, steps)


def _load_packet(path: Path) -> LoadedWindow:
    """An evidence packet, or the summary packet of a window collected as node summaries."""
    try:
        obj = packet_json(read_capped(path, "packet_bytes"))
        packet = summary_packet_from_dict(obj) if is_summary_packet(obj) else packet_from_dict(obj)
    except ReportFormatError as exc:
        raise ReportFormatError(f"{path}: {exc}") from None
    return LoadedWindow(report=packet.reanalyze(), meta=packet.meta, stored_report=packet.report)


def _load_trace(
    path: Path | list[Path],
    kind: str,
    stages: Sequence[str] | None,
    options: TraceOptions | None,
    steps: tuple[int, int] | None,
) -> LoadedWindow:
    reduced = reduce_trace(path, kind, stages, options)
    if steps is not None:
        first, last = steps
        wanted = [s for s in reduced.step_ids if first <= s <= last]
        if not wanted:
            raise ReportFormatError(
                f"{path}: no step id in {first}:{last} among {id_text(reduced.step_ids)}"
            )
        reduced = reduced.select_steps(wanted)
    return LoadedWindow(report=reduced.analyze(), meta=reduced.summary(), notes=reduced.notes)


# --- output folders and windows.jsonl -------------------------------------------------------------


def _is_output_folder(path: Path) -> bool:
    """An output folder (``windows.jsonl`` or ``packets/``) or a folder of packets."""
    if not path.is_dir():
        return False
    return (
        (path / WINDOWS_FILE).is_file()
        or (path / PACKETS_FOLDER).is_dir()
        or any(path.glob(PACKET_GLOB))
    )


def _load_from_folder(folder: Path, window: int | None, attempt: int | None) -> LoadedWindow:
    """One window of an output folder: its packet when there is one, else its record."""
    packets = folder / PACKETS_FOLDER if (folder / PACKETS_FOLDER).is_dir() else folder
    # a folder given as its packets/ has its windows.jsonl one level up; a single-process run's
    # output folder holds windows.jsonl and no packets/
    beside = packets is not folder or (folder / WINDOWS_FILE).is_file()
    run_folder = folder if beside else folder.parent
    if window is None:
        held = sorted(p.name for p in packets.glob(PACKET_GLOB))
        count = f"{len(held)} packet(s)" if held else "window records"
        raise ReportFormatError(
            f"{folder}: a StageFrontier output folder ({count}); report every window with "
            f"`stagefrontier report {run_folder}`, or analyze one with --window N"
        )
    if attempt is None:
        attempts = sorted(packets.glob(f"window-{window:06d}*.json"))
        if len(attempts) > 1:
            raise ReportFormatError(
                f"{folder}: window {window} has a packet from each of {len(attempts)} restart "
                f"attempts ({', '.join(p.name for p in attempts)}); name one as ATTEMPT/{window}"
            )
    packet = packets / packet_name({"window": window, "attempt": attempt or 0})
    if packet.is_file():
        return _load_packet(packet)
    jsonl = run_folder / WINDOWS_FILE
    if jsonl.is_file():
        return _load_record(jsonl, window, attempt)
    raise ReportFormatError(f"{folder}: no packet {packet.name} and no {WINDOWS_FILE}")


def _load_record(path: Path, window: int | None, attempt: int | None) -> LoadedWindow:
    """One window's record, the file read a line at a time whatever its length."""
    records, count, held = records_of_window(path, window, attempt)
    if window is None:
        raise ReportFormatError(
            f"{path}: a windows.jsonl of {count} window(s) ({held}); analyze one with --window "
            f"N, or report them all with `stagefrontier report {path.parent}`"
        )
    record = select_record(records, window, attempt, str(path), held or "none")
    meta = record_meta(record)
    meta["source"] = f"{path.name} (the stored report; the window's packet re-analyzes it)"
    return LoadedWindow(report=record_report(record, str(path)), meta=meta)


# --- one line of metadata -------------------------------------------------------------------------

_PER_RANK_TABLES = frozenset({"pids", "local_ranks", "probes", "hosts", "lead", "ranks_present"})


def _one_line(meta: dict[str, Any]) -> dict[str, Any]:
    """Window metadata for one line: see ``LoadedWindow.facts``."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key in _PER_RANK_TABLES or value in ([], None):
            continue
        if isinstance(value, list) and all(isinstance(x, int) for x in value):
            out[key] = id_text(value)
        elif not isinstance(value, dict | list):
            out[key] = value
    if meta.get("ranks_present"):
        out["ranks"] = id_text(meta["ranks_present"])
    hosts = meta.get("hosts")
    if isinstance(hosts, dict) and hosts:
        out["hosts"] = ",".join(sorted({str(h) for h in hosts.values()}))
    lead = meta.get("lead")
    if isinstance(lead, dict) and lead.get("scope") not in (None, "rank"):
        out["lead"] = f"{lead['scope']} (ranks {id_text(lead.get('ranks', []))})"
    return out
