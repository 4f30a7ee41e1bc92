"""``stagefrontier incident DIR``: read incidents, and reduce the traces that were not reduced
live (on another host, or rank 0 stopped first), against the run's evidence packets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..analysis.gates import Gates
from ..errors import ReportFormatError, StageFrontierError
from ..formats.incident import INCIDENT_FILE, read_incident, scan_incidents
from ..formats.limits import regular_file_inside
from ..formats.packet import read_packet
from ..formats.records import WINDOWS_FILE, iter_records, uncut_record
from ..render.incident import write_incident
from .confirm import LiveWindow
from .decide import MIN_SHARE
from .html import write_html
from .reduction import analyze_traces
from .worker_profile import worker_findings


def incident_folders(path: str | os.PathLike[str]) -> tuple[list[Path], list[str]]:
    """The incident folders of ``path``: itself when it holds ``incident.json``, else the
    readable ones under ``path/incidents``; and one line per folder skipped (unreadable)."""
    p = Path(path)
    if os.path.lexists(p / INCIDENT_FILE):
        return [p], []
    if not p.is_dir():
        raise StageFrontierError(f"{p} is neither an incident folder nor an output folder")
    found, problems = scan_incidents(p)
    return [folder for folder, _ in found], problems


def local_traces(folder: Path, incident: dict[str, Any]) -> dict[int, str]:
    """The incident's trace files found in ``folder``, by rank (the folder may have been copied
    from the host that wrote it, so each is looked up by its name), each a regular file inside
    the folder (a link out of it, a FIFO or a device is never read)."""
    files: dict[int, str] = {}
    for rank, path in incident["trace_files"].items():
        local = regular_file_inside(folder / Path(path).name, folder)
        if local is not None:
            files[int(rank)] = str(local)
    return files


def incident_traces(
    folder: Path,
) -> tuple[dict[int, str], list[str] | None, tuple[int, int] | None]:
    """``stagefrontier analyze INCIDENT_DIR``: the folder's traces by rank, the stages the live
    incident read them with (those of its shares, None when it was not reduced) and the steps
    it compared (its captured steps, None when it names none). With the stages, a between-step
    wait (``timer.iter``: a range ``data.next_wait@step#N``, never a stage range of its own) is
    charged to its stage as it was live, where inferring the stages from the ranges would leave
    it out; with the steps, a step the trace holds outside the capture (the profiler starts
    inside the step before the first captured one, and its start-up is charged there) is left
    out as it was live.

    Raises:
        ReportFormatError: an unreadable incident, or one with no trace in the folder.
    """
    incident = read_incident(folder)
    files = local_traces(folder, incident)
    if not files:
        why = "nothing was captured" if not incident["captured"] else "its traces are not here"
        raise ReportFormatError(f"{folder}: incident {incident['id']} has no trace: {why}")
    stages = list(incident["trace_shares"] or incident["live_shares"]) or None
    span = incident["steps"]
    steps = (int(span[0]), int(span[1])) if len(span) == 2 else None
    return files, stages, steps


def run_folder(incident_folder: Path) -> Path:
    """``out_dir`` of ``out_dir/incidents/<id>``; the incident folder itself when it was copied
    out of its run folder (nothing outside it is then read)."""
    parent = incident_folder.parent
    return parent.parent if parent.name == "incidents" else incident_folder


def packet_windows(out_dir: Path) -> list[LiveWindow]:
    """The live windows an output folder's evidence packets hold (unreadable ones skipped: the
    confirmation then says no live window covers the steps)."""
    out = []
    for path in sorted((out_dir / "packets").glob("window-*.json")):
        try:
            packet = read_packet(path)
        except ReportFormatError:
            continue
        meta = packet.meta
        if "first_step" not in meta or "ranks_present" not in meta:
            continue
        out.append(
            LiveWindow(
                int(meta["first_step"]),
                tuple(int(r) for r in meta["ranks_present"]),
                packet.d,
                tuple(packet.stages),
            )
        )
    return out


def window_records(out_dir: Path) -> Iterator[dict[str, Any]]:
    """The records of an output folder's ``windows.jsonl``, one line at a time, whatever the
    file's size (none when it is missing; they stop at a line that cannot be read: the
    incident then has the loader figures of the records before it, or none)."""
    try:
        for _, record in iter_records(out_dir / WINDOWS_FILE, uncut_record):
            if record is not None:  # a record the disk budget cut has no loader figures
                yield record
    except (OSError, ReportFormatError):
        return


def reduce_offline(
    folder: Path, gates: Gates | None = None, budget_bytes: int | None = None
) -> tuple[dict[str, Any], bool]:
    """The incident of ``folder``; when it was captured but not reduced and every trace is
    here, reduce it now and rewrite its files (the page's figures within ``budget_bytes``:
    ``html.write_html``). Returns (incident, whether it was reduced)."""
    incident = read_incident(folder)
    if not incident["captured"] or incident["confirmed"] is not None:
        return incident, False
    files = local_traces(folder, incident)
    if len(files) < len(incident["trace_files"]):
        return incident, False
    out_dir = run_folder(folder)
    analyze_traces(incident, files, packet_windows(out_dir), gates, out_dir)
    # the DataLoader workers' profiles, as rank 0 reduces them live (the loader's advice from
    # ``windows.jsonl``'s figures)
    worker_findings(incident, window_records(out_dir), MIN_SHARE)
    if incident.get("reduced") == "pending":
        incident["reduced"] = "after the run"
        incident["reasons"].append(
            "reduced after the run by `stagefrontier incident`, against the run's packets"
        )
    else:
        incident["reduced"] = "offline"
        incident["reasons"].append("reduced offline by `stagefrontier incident`")
    write_incident(folder, incident)
    write_html(folder, incident, out_dir, budget_bytes=budget_bytes)
    return incident, True


def redraw(folder: Path, budget_bytes: int | None = None) -> tuple[dict[str, Any], bool]:
    """The incident of ``folder`` reduced now when the run left it unreduced
    (``reduce_offline``), else its page written again: its figures may be drawable now
    (matplotlib installed since, or the run over). Returns (incident, whether it was
    reduced)."""
    incident, reduced = reduce_offline(folder, budget_bytes=budget_bytes)
    if not reduced:
        write_html(folder, incident, run_folder(folder), budget_bytes=budget_bytes)
    return incident, reduced


def draw_pages(folders: list[str], budget_bytes: int) -> None:
    """What the process ``html.draw_later`` starts does: ``redraw`` each incident folder of a
    run that just ended, its figures within the run folder's disk budget. A folder that
    cannot be read is passed over (no one reads this process's output: the page keeps its
    note)."""
    for folder in folders:
        try:
            redraw(Path(folder), budget_bytes)
        except (StageFrontierError, OSError):
            continue
