"""``incidents/<id>/incident.json``: its typed record (``Incident``, checked on read and before
writing by its declaration, ``formats.typed``), its reader and its writer (the text beside it
comes from ``render.incident``). Its JSON Schema is ``docs/schemas/incident.json``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ..analysis.values import check_document
from ..errors import ReportFormatError
from .limits import MAX_CAPTURE_STEPS, MAX_NAMED_RANKS, limit, read_capped
from .packet import write_bytes_atomically
from .typed import (
    Amount,
    Count,
    Number,
    PlainName,
    Rank,
    RankList,
    Step,
    Text,
    check,
    check_ranks,
    decode_json,
)
from .wall_clock import WallClock

INCIDENT_FORMAT: Final = "stagefrontier.incident"
INCIDENT_VERSION: Final = 1
INCIDENT_FILE = "incident.json"
_INCIDENT_ID = re.compile(r"^w(\d+)(?:-attempt(\d+))?")


def incident_id_of(window: int, attempt: int, manual: int | None = None) -> str:
    """The id (and folder name) of an incident opened on ``window`` of ``attempt``, the
    attempt the output folder gave the window's record (``sinks.output_folder``): ``w00005``
    in the folder's first attempt, ``w00005-attempt1`` in its next, so that a job resumed into
    the folder never reuses an id. ``manual``: the number of the capture asked by hand, as
    ``-manual<k>`` at the end."""
    name = f"w{max(window, 0):05d}" + (f"-attempt{attempt}" if attempt else "")
    return name + (f"-manual{manual}" if manual is not None else "")


def incident_window(name: str) -> tuple[int, int] | None:
    """The (attempt, window) an incident id names (``incident_id_of``), None when it names none.
    A folder written before the id carried the folder's attempt holds torchelastic's restart
    count there, which is the same attempt unless a job was resumed into the folder."""
    match = _INCIDENT_ID.match(name)
    return None if match is None else (int(match[2] or 0), int(match[1]))


MAX_LIST = 1000
"""The most reasons, op diff rows or stage shares an incident may hold."""
Reduced = Literal["live", "pending", "after the run", "offline"]
"""Where an incident's traces were reduced (``reduced``): on rank 0's router thread as the
capture settled, not yet (the run ended as it settled: left to the process started after the
run), by that process, or by a later ``stagefrontier incident``."""

RankKey = Annotated[str, msgspec.Meta(pattern="^[0-9]{1,7}(?![\\s\\S])")]
"""A rank number as an object key (within the world size limit: ``_check_rank_keys``)."""
Shares = Annotated[dict[Text, Number], msgspec.Meta(max_length=MAX_LIST)]
Texts = Annotated[list[Text], msgspec.Meta(max_length=MAX_LIST)]
Span = Annotated[list[Step], msgspec.Meta(max_length=2)]
"""``[first, last]`` (checked by ``_check_span``)."""


def _check_span(span: list[int], what: str, allow_empty: bool, most: int | None) -> None:
    """Raise ValueError unless ``span`` is ``[first, last]`` with first <= last (spanning fewer
    than ``most`` when given), or empty where ``allow_empty``."""
    if allow_empty and not span:
        return
    if len(span) != 2 or span[0] > span[1] or (most is not None and span[1] - span[0] >= most):
        at_most = f", spanning at most {most}" if most is not None else ""
        raise ValueError(f"{what} must be [first, last], first <= last{at_most}")


def _check_rank_keys(what: str, *maps: dict[str, Any] | None) -> None:
    check_ranks((int(k) for m in maps if m for k in m), what)


class OpRow(msgspec.Struct):
    """One op of the op diff: its time per step on the suspect and the reference rank."""

    name: Text
    suspect_ms_per_step: Number
    reference_ms_per_step: Number
    diff_ms_per_step: Number | UnsetType = UNSET
    call_path: Texts | UnsetType = UNSET


class WorkerRow(msgspec.Struct):
    """One function of the suspect's DataLoader workers against the reference's."""

    name: Text
    suspect_ms_per_batch: Number
    reference_ms_per_batch: Number
    suspect_ms_per_call: Number
    reference_ms_per_call: Number
    calls_per_batch: Number


WorkerRows = Annotated[list[WorkerRow], msgspec.Meta(max_length=MAX_LIST)]


class LateInto(msgspec.Struct):
    """The late rank the ranks' timed collectives name in a regression's stage."""

    rank: Count
    stage: Text
    bucket: Count
    last_bucket: bool
    family: Text | UnsetType = UNSET
    """The collective's family (``all_reduce``, ``all_gather``, ...); absent from older
    incidents, read as DDP's."""


class Regression(msgspec.Struct):
    """What ``render.regression_text.regression_text`` reads of a regression (it holds more)."""

    baseline_windows: Annotated[list[Count], msgspec.Meta(min_length=2, max_length=2)]
    top_stage: Text
    delta_exposed_ms_per_step: Number
    delta_advance_ms_per_step: Shares
    ranks: RankList
    all_ranks: bool
    late: LateInto | None = None

    def __post_init__(self) -> None:
        check_ranks(self.ranks, "ranks")
        if self.top_stage not in self.delta_advance_ms_per_step:
            raise ValueError("its top stage must have a delta")


class ReferenceCapture(msgspec.Struct):
    """The earlier trace a regression's capture was diffed against."""

    path: Text
    rank: Rank
    steps: Span
    incident: Text | UnsetType = UNSET
    from_baseline: bool | UnsetType = UNSET

    def __post_init__(self) -> None:
        check_ranks((self.rank,), "rank")
        _check_span(self.steps, "steps", allow_empty=False, most=MAX_CAPTURE_STEPS)


class RouterCpu(msgspec.Struct):
    """CPU seconds of the router's threads: each rank's trace export, rank 0's reduction."""

    export: Annotated[dict[RankKey, Amount], msgspec.Meta(max_length=MAX_NAMED_RANKS)]
    reduction: Amount

    def __post_init__(self) -> None:
        _check_rank_keys("export", self.export)


class LoaderState(msgspec.Struct):
    saturated: bool | UnsetType = UNSET


class Incident(msgspec.Struct):
    """An incident as ``incident.json`` holds it (format ``stagefrontier.incident``, version 1).
    The fields after ``reasons`` came later: an incident written before them still reads."""

    format: Literal["stagefrontier.incident"]
    version: Literal[1]
    id: PlainName
    trigger: Literal["window", "regression", "manual"]
    window: Step | None
    steps: Span
    stage: Text | None
    leader_rank: Rank | None
    reference_rank: Rank | None
    requested_ranks: RankList
    ranks: RankList
    trace_files: Annotated[dict[RankKey, Text], msgspec.Meta(max_length=MAX_NAMED_RANKS)]
    trace_hosts: Annotated[dict[RankKey, Text], msgspec.Meta(max_length=MAX_NAMED_RANKS)]
    trace_bytes: Annotated[dict[RankKey, Count], msgspec.Meta(max_length=MAX_NAMED_RANKS)]
    captured: bool
    confirmed: bool | None
    max_share_diff: Amount | None
    trace_shares: Shares
    live_shares: Shares
    op_diff: Annotated[list[OpRow], msgspec.Meta(max_length=MAX_LIST)]
    capture_step_ms: Amount | None
    baseline_step_ms: Amount | None
    time_to_confirmation_s: Amount | None
    reasons: Texts
    regression: Regression | None = None
    reference_capture: ReferenceCapture | None = None
    router_cpu_s: RouterCpu | None = None
    training_thread_s: dict[RankKey, Amount] | UnsetType | None = UNSET
    worker_op_diff: (
        Annotated[list[WorkerRow], msgspec.Meta(max_length=MAX_LIST)] | UnsetType | None
    ) = UNSET
    loader_advice: Text | UnsetType | None = UNSET
    loader: LoaderState | UnsetType | None = UNSET
    reduced: Reduced | UnsetType | None = UNSET
    baseline_steps: Span | UnsetType | None = UNSET
    wall_clock: WallClock | UnsetType | None = UNSET
    lead_block_steps: Count | UnsetType | None = UNSET
    """The steps the suspect's DataLoader workers hand their batches over in, when its lead was
    judged over blocks of that many steps: the confirmation's blocks are at least that long."""
    routed_below_top: bool | UnsetType | None = UNSET
    """True when the stage was routed below the window's top stage, whose lead passed between
    ranks: the confirmation does not ask it to be on top of the captured steps."""

    def __post_init__(self) -> None:
        for name in ("leader_rank", "reference_rank"):
            rank = getattr(self, name)
            check_ranks(() if rank is None else (rank,), name)
        check_ranks(self.requested_ranks, "requested_ranks")
        check_ranks(self.ranks, "ranks")
        for name in ("trace_files", "trace_hosts", "trace_bytes"):
            _check_rank_keys(name, getattr(self, name))
        if isinstance(self.training_thread_s, dict):
            _check_rank_keys("training_thread_s", self.training_thread_s)
        _check_span(self.steps, "steps", allow_empty=True, most=MAX_CAPTURE_STEPS)
        if isinstance(self.baseline_steps, list):
            _check_span(self.baseline_steps, "baseline_steps", allow_empty=False, most=None)


def new_incident(incident_id: str, trigger: str) -> dict[str, Any]:
    """A new incident's fields, every one at its empty value, as the JSON object it is written
    as (the router fills it in)."""
    empty = Incident(
        format=INCIDENT_FORMAT,
        version=INCIDENT_VERSION,
        id=incident_id,
        trigger=trigger,  # type: ignore[arg-type]  # checked when it is written
        window=None,
        steps=[],
        stage=None,
        leader_rank=None,
        reference_rank=None,
        requested_ranks=[],
        ranks=[],
        trace_files={},
        trace_hosts={},
        trace_bytes={},
        captured=False,
        confirmed=None,
        max_share_diff=None,
        trace_shares={},
        live_shares={},
        op_diff=[],
        capture_step_ms=None,
        baseline_step_ms=None,
        time_to_confirmation_s=None,
        reasons=[],
    )
    return msgspec.to_builtins(empty)  # type: ignore[no-any-return]


def check_incident(data: Any, source: str = "incident") -> dict[str, Any]:
    """The incident, checked: format, version, and every field's type and range as ``Incident``
    declares them (ids are plain names, step spans bounded, numbers finite), so that nothing a
    reader or renderer does with it can fail or grow with what a crafted file states.

    Raises:
        ReportFormatError: naming the first field that is wrong and what it must be.
    """
    document = check_document(data, INCIDENT_FORMAT, INCIDENT_VERSION, "incident", source=source)
    check(document, Incident, source)
    return document


def write_incident_files(
    folder: str | os.PathLike[str], incident: dict[str, Any], markdown: str
) -> Path:
    """Write ``incident.json`` and ``incident.md`` (``markdown``, from
    ``render.incident.render_markdown``), each atomically (a failed write, say on a full disk,
    raises OSError and leaves the previous file and no temporary one); returns the JSON path."""
    check_incident(incident)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(incident, indent=1, allow_nan=False)
    write_bytes_atomically(path / INCIDENT_FILE, text.encode())
    write_bytes_atomically(path / "incident.md", markdown.encode())
    return path / INCIDENT_FILE


def read_incident(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an incident from its folder or its ``incident.json`` (a regular file within the
    ``incident_bytes`` limit, nested at most ``formats.typed.MAX_DEPTH`` deep); raises
    ReportFormatError."""
    p = Path(path)
    if p.is_dir():
        p = p / INCIDENT_FILE
    try:
        data = read_capped(p, "incident_bytes")
    except ReportFormatError as exc:
        raise ReportFormatError(f"{p}: {exc}") from None
    except OSError as exc:
        raise ReportFormatError(f"{p}: not a readable incident: {exc.strerror or exc}") from None
    document = decode_json(data, str(p), "incident", limit("incident_bytes"))
    return check_incident(document, str(p))


def scan_incidents(
    out_dir: str | os.PathLike[str],
) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """The incident folders under ``out_dir/incidents`` with their incidents, found by folder
    (a renamed or copied folder is read where it is), and one line per folder whose
    ``incident.json`` cannot be read."""
    found: list[tuple[Path, dict[str, Any]]] = []
    problems: list[str] = []
    for path in sorted((Path(out_dir) / "incidents").glob(f"*/{INCIDENT_FILE}")):
        try:
            found.append((path.parent, read_incident(path)))
        except ReportFormatError as exc:
            problems.append(f"skipped {exc}")
    return found, problems


def list_incidents(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable incidents under ``out_dir/incidents``, oldest first (``scan_incidents``
    also says which were skipped)."""
    return [incident for _, incident in scan_incidents(out_dir)[0]]
