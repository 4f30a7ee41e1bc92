"""Summary packets: the evidence packet of a window collected as node summaries.

A hierarchical window never has its ``[N, R, S]`` matrix in one place; its packet stores the
combined ``WindowSummary`` instead (``summary_codec``'s bytes, base64 encoded), so its size is
fixed by the steps, stages and summary settings plus the rank list, whatever the number of
ranks. Everything else follows the evidence packet: gates, collection facts as side evidence,
a free-form ``meta`` (nodes, suspects, ...) and the stored report, which ``reanalyze`` gives
back through ``analyze_summary``.

Layout (JSON object)::

    {"format": "stagefrontier.formats.summary_packet", "version": 1,
     "summary": {"codec": "sfs1+base64", "data": "..."},
     "side": {...} | null, "gates": {...}, "meta": {...}, "report": {...}}
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.analyzer import analyze_summary
from ..analysis.gates import Gates
from ..analysis.side import SideEvidence
from ..analysis.summary import WindowSummary
from ..analysis.values import check_document
from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError
from .limits import read_capped
from .packet import (
    object_field,
    packet_json,
    run_field,
    write_bytes_atomically,
)
from .stored_report import check_stored_report, check_window_meta
from .summary_codec import decode_summary, encode_summary

SUMMARY_PACKET_FORMAT = "stagefrontier.formats.summary_packet"
SUMMARY_PACKET_VERSION = 1
SUMMARY_CODEC = "sfs1+base64"
_FIELDS = ("summary", "side", "gates", "meta", "report")


@dataclass(frozen=True, eq=False)
class SummaryPacket:
    """A decoded summary packet; ``reanalyze()`` reproduces ``report``."""

    summary: WindowSummary
    gates: Gates
    side: SideEvidence | None
    meta: dict[str, Any]
    report: WindowReport

    @classmethod
    def of_summary(
        cls,
        summary: WindowSummary,
        report: WindowReport,
        *,
        side: SideEvidence | None = None,
        meta: dict[str, Any] | None = None,
    ) -> SummaryPacket:
        """The packet of one analyzed summary; its gates are the report's.

        Raises:
            ReportFormatError: the report does not describe this summary.
        """
        packet = cls(summary, report.gates, side, dict(meta or {}), report)
        _check_consistent(packet)
        return packet

    def reanalyze(self) -> WindowReport:
        """The analysis of the stored summary under the stored gates and side evidence."""
        return analyze_summary(self.summary, gates=self.gates, side=self.side)


def summary_packet_bytes(packet: SummaryPacket) -> bytes:
    """The packet as compact UTF-8 JSON."""
    _check_consistent(packet)
    obj = {
        "format": SUMMARY_PACKET_FORMAT,
        "version": SUMMARY_PACKET_VERSION,
        "summary": {
            "codec": SUMMARY_CODEC,
            "data": base64.b64encode(encode_summary(packet.summary)).decode("ascii"),
        },
        "side": None if packet.side is None else packet.side.to_dict(),
        "gates": packet.gates.to_dict(),
        "meta": dict(packet.meta),
        "report": packet.report.to_dict(),
    }
    try:
        text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ReportFormatError(f"packet is not JSON-serializable (check meta): {exc}") from None
    return text.encode("utf-8")


def write_summary_packet(path: str | os.PathLike[str], packet: SummaryPacket) -> Path:
    """Write a summary packet atomically; returns the path written."""
    return write_bytes_atomically(path, summary_packet_bytes(packet))


def read_summary_packet(path: str | os.PathLike[str]) -> SummaryPacket:
    """Read and check a summary packet file; any defect raises ReportFormatError."""
    return summary_packet_from_dict(packet_json(read_capped(path, "packet_bytes")))


def is_summary_packet(obj: Any) -> bool:
    """Whether a parsed packet object says it is a summary packet."""
    return isinstance(obj, dict) and obj.get("format") == SUMMARY_PACKET_FORMAT


def summary_packet_from_dict(obj: Any) -> SummaryPacket:
    """Check a parsed summary packet object and decode it."""
    obj = check_document(
        obj, SUMMARY_PACKET_FORMAT, SUMMARY_PACKET_VERSION, "summary packet", _FIELDS
    )
    summary = decode_summary(_summary_bytes(object_field(obj["summary"], "summary")))
    side = None
    if obj["side"] is not None:
        side = run_field("side", SideEvidence.from_dict, object_field(obj["side"], "side"))
    gates = run_field("gates", Gates.from_dict, object_field(obj["gates"], "gates"))
    meta = run_field("meta", check_window_meta, object_field(obj["meta"], "meta"))
    report = run_field("report", WindowReport.from_dict, object_field(obj["report"], "report"))
    check_stored_report(report)
    packet = SummaryPacket(summary, gates, side, meta, report)
    _check_consistent(packet)
    return packet


def _summary_bytes(field: dict[str, Any]) -> bytes:
    if field.get("codec") != SUMMARY_CODEC or not isinstance(field.get("data"), str):
        raise ReportFormatError(
            f"packet field 'summary' must hold codec {SUMMARY_CODEC!r} and base64 data"
        )
    try:
        return base64.b64decode(field["data"].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ReportFormatError(f"packet field 'summary' is not valid base64: {exc}") from None


def _check_consistent(packet: SummaryPacket) -> None:
    summary, report = packet.summary, packet.report
    if tuple(report.stages) != summary.stages or (report.n_steps, report.n_ranks) != (
        summary.n_steps,
        summary.n_ranks,
    ):
        raise ReportFormatError(
            f"packet report describes {report.n_steps} steps x {report.n_ranks} ranks of "
            f"{report.stages}, but the summary covers {summary.n_steps} steps x "
            f"{summary.n_ranks} ranks of {list(summary.stages)}"
        )
    if report.gates != packet.gates:
        raise ReportFormatError("packet report was computed with other gates than the packet's")
