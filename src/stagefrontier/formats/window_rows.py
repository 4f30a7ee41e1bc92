"""The few fields of a stored window that a long run's summary reads, decoded without the rest.

A run folder of a month-long job holds about a hundred thousand windows. Its report reads every
window once, but keeps only a handful in full (``formats.run_folder``); the others count in a
summary through a :class:`WindowRow`: the window's index and steps, its exposed time, its
shares and the leader of each stage, its labels. ``msgspec`` decodes a ``windows.jsonl`` line
(or a packet's ``report`` and ``meta``) straight into these typed fields and skips the others,
which is several times faster than decoding and checking the whole report; every field read
is still checked against its declared type and range, and a window kept in full is checked in
full (``formats.records.check_record``, ``formats.packet.read_packet``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from ..errors import NotJsonError, ReportFormatError
from .stored_report import HostSignals
from .typed import Amount, Count

T = TypeVar("T")
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class RowGates(msgspec.Struct):
    """The two gates that decide whether a stage's lead rank switches too often to name one
    (``analysis.leaders.lead_switches``)."""

    min_confident_fraction: Fraction
    max_switch_rate: Amount


class RowLocalization(msgspec.Struct):
    """Who leads one (broad) stage, as ``analysis.leaders.single_leader`` reads it."""

    leader_rank: Count | None
    leader_fraction: Fraction
    confident_steps: Count = 0
    leader_switches: Count = 0
    leading_ranks: list[Count] = msgspec.field(default_factory=list)


class RoleRow(msgspec.Struct):
    """One role's own report in a window of ranks in different roles, as the run summary reads
    it: whether its shares are defined, and its broad stages' shares."""

    shares_defined: bool
    semantic_shares: dict[str, float]


class ReportRow(msgspec.Struct):
    """A stored report's fields that the run summary reads: a window's exposed time, its
    shares and the leader of each stage, its labels; the other fields are skipped."""

    stages: list[str]
    n_steps: Annotated[int, msgspec.Meta(ge=1)]
    n_ranks: Annotated[int, msgspec.Meta(ge=1)]
    exposed_s: Amount
    shares_defined: bool
    shares: dict[str, float]
    semantic_shares: dict[str, float]
    semantic_localization: dict[str, RowLocalization]
    gates: RowGates
    top1: str | None = None
    labels: list[str] = msgspec.field(default_factory=list)
    routing_set: list[str] = msgspec.field(default_factory=list)
    co_critical_stages: list[str] = msgspec.field(default_factory=list)
    role_reports: dict[str, RoleRow] | None = None

    def __post_init__(self) -> None:
        if set(self.shares) != set(self.stages):
            raise ValueError("its shares do not hold one value per stage")
        if set(self.semantic_localization) != set(self.semantic_shares):
            raise ValueError("its semantic shares and leaders name different stages")
        if self.top1 is not None and self.top1 not in self.semantic_shares:
            raise ValueError(f"its top stage {self.top1!r} has no share")


class WindowRow(ReportRow, kw_only=True):
    """A window as the run summary reads it: its facts and the report fields it counts."""

    window: Count
    first_step: int
    last_step: int
    attempt: Count = 0
    regression: dict[str, Any] | None = None
    missing_ranks: list[Count] = msgspec.field(default_factory=list)
    self_cost: dict[str, Any] | None = None
    wall_clock: dict[str, Any] | None = None
    compacted: bool = False
    """The disk budget cut the record down to these fields (``summary_record``)."""

    @property
    def mean_step_s(self) -> float:
        return self.exposed_s / self.n_steps

    @property
    def key(self) -> tuple[int, int]:
        """Where the window sorts in its run: (restart attempt, window)."""
        return self.attempt, self.window

    def facts(self) -> dict[str, Any]:
        """The window facts a table cell reads (``render.text.index_text``, ``clock_cell``)."""
        facts: dict[str, Any] = {
            "window": self.window,
            "attempt": self.attempt,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }
        if self.wall_clock is not None:
            facts["wall_clock"] = self.wall_clock
        return facts


def record_row(record: dict[str, Any]) -> WindowRow:
    """A whole record (a JSON object) as its :class:`WindowRow`; ReportFormatError when it is
    not one a summary can read."""
    try:
        return msgspec.convert(record, WindowRow)
    except msgspec.ValidationError as exc:
        raise ReportFormatError(f"not a window record: {exc}") from None


def summary_record(record: dict[str, Any], row: WindowRow) -> dict[str, Any]:
    """``record`` (a whole ``windows.jsonl`` record) cut down to what a run's summary reads of
    it, its ``row`` (``record_row``), marked ``"compacted": true``: the disk budget's
    compaction of an old healthy window's record (``sinks.record_compaction``), about a fifth
    of its bytes. Its run id stays first, as every record begins
    (``formats.records.RECORD_START``), and its report's format and version stay, which tell a
    file of records."""
    kind = {key: record[key] for key in ("format", "version") if key in record}
    fields = msgspec.to_builtins(row)
    fields["compacted"] = True
    return {"run_id": record.get("run_id"), **kind, **fields}


class LeanPacket(msgspec.Struct):
    """A packet as the run summary reads it: its matrix (decoded by ``formats.packet``), its
    stages, its report's summary fields, and its facts left undecoded until a window without a
    record needs them. Every field a packet holds is declared, so that one of the wrong kind
    (a string for the version, the gates or a report's step count) is refused here, in the one
    decoding of the packet, not only when the packet is read whole."""

    format: Literal["stagefrontier.formats.packet"]
    version: Literal[1]
    d: dict[str, Any]
    stages: list[str]
    roles: list[str] | None
    side: dict[str, Any] | None
    gates: RowGates
    meta: msgspec.Raw
    report: ReportRow


class WindowKey(msgspec.Struct):
    """Which window a ``windows.jsonl`` line is: its index and restart attempt."""

    window: Count
    attempt: Count = 0


class PacketHost(msgspec.Struct):
    """A packet's ``meta`` as ``compare`` reads it: the window's host signals, when kept."""

    host_signals: HostSignals | UnsetType = UNSET


_ROW = msgspec.json.Decoder(WindowRow)
_KEY = msgspec.json.Decoder(WindowKey)
_PACKET = msgspec.json.Decoder(LeanPacket)
_HOST = msgspec.json.Decoder(PacketHost)


def decode_row(line: bytes) -> WindowRow:
    """A ``windows.jsonl`` line as a :class:`WindowRow`.

    Raises:
        NotJsonError: the line is not JSON (a record cut short, say).
        ReportFormatError: it is JSON but not a window record, naming the field.
    """
    return _decoded(_ROW, line)


def decode_key(line: bytes) -> WindowKey:
    """A ``windows.jsonl`` line's :class:`WindowKey` (raises as ``decode_row`` does)."""
    return _decoded(_KEY, line)


def _decoded(decoder: msgspec.json.Decoder[T], line: bytes) -> T:
    try:
        return decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise ReportFormatError(f"not a window record: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise NotJsonError(str(exc)) from None


def decode_lean_packet(data: bytes) -> LeanPacket:
    """A packet file's bytes as a :class:`LeanPacket`; ReportFormatError when they are not."""
    try:
        return _PACKET.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ReportFormatError(f"not a packet: {exc}") from None


def packet_host_signals(packet: LeanPacket) -> dict[str, Any]:
    """The host signals a packet's ``meta`` holds (empty when it holds none); ReportFormatError
    when they are malformed."""
    try:
        signals = _HOST.decode(packet.meta).host_signals
    except msgspec.ValidationError as exc:
        raise ReportFormatError(f"malformed window facts: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ReportFormatError(f"not a window's packet: {exc}") from None
    if isinstance(signals, UnsetType):
        return {}
    return {k: v for k, v in msgspec.structs.asdict(signals).items() if v is not UNSET}


def packet_row(packet: LeanPacket) -> WindowRow:
    """The :class:`WindowRow` of a packet whose window has no record (its meta and report)."""
    try:
        meta = msgspec.json.decode(packet.meta)
        if not isinstance(meta, dict):
            raise ReportFormatError("packet field 'meta' must be an object")
        return msgspec.convert({**msgspec.to_builtins(packet.report), **meta}, WindowRow)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ReportFormatError(f"not a window's packet: {exc}") from None
