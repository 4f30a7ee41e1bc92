"""The binary form of what a node leader sends up the tree: one envelope per group and window.

Layout: a fixed header (magic, version, metadata length, body length), a UTF-8 JSON metadata
block (the window, the nodes the group covers, what is missing from it and why, the collection
facts the analysis reports, a typical rank per stage, the rows a capture request asked for and
the group's timed collectives summarized), then the body: the group's summary as its own codec
writes it.
Nothing is unpickled; every size and field is checked before use, and a bad envelope raises
ReportFormatError (its parent then reports the group missing, with the error as the reason).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from ..analysis.collective_summary import CollectiveSummary
from ..errors import ReportFormatError
from ..formats.envelope import open_envelope, seal_envelope
from ..formats.limits import MAX_NAMED_RANKS
from .wire_checks import check_meta_value

MAGIC = b"SFN1"
NODE_WIRE_VERSION = 3
_HEADER = struct.Struct("<4sHIQ")
MAX_META_BYTES = 16 << 20
MAX_NOTES = 32
"""Notes a part carries; past this, one more says how many were left out (a part's size must not
grow with the number of ranks that have something to say)."""
ROW_REQUESTS = 2
"""Capture requests a leader keeps carrying rows for (the open one and the one before it)."""


@dataclass(frozen=True)
class NodePart:
    """A group of consecutive nodes' share of one window (one node, at the bottom of the tree)."""

    window: int
    first_step: int
    last_step: int
    first_node: int
    node_count: int
    missing_nodes: dict[int, str] = field(default_factory=dict)
    """Nodes of the group with nothing in the body, and why."""
    missing_ranks: tuple[int, ...] = ()
    """Ranks of the present nodes whose window did not reach their leader (or was rejected)."""
    mismatched_ranks: tuple[int, ...] = ()
    """Ranks whose window did not match the group's schema or steps: not in the body."""
    notes: tuple[str, ...] = ()
    hosts: dict[int, str] = field(default_factory=dict)
    """The host of each node the group's top prefixes name (bounded by the summary's size)."""
    contract_violations: int = 0
    overlap_ns: int = 0
    self_cost_max: dict[str, float] = field(default_factory=dict)
    """StageFrontier's own cost, the largest over the group's ranks: per component (seconds)
    and as a fraction of step time (``record.self_cost``; maxima merge exactly, medians not)."""
    events: tuple[float, ...] = ()
    """The group's sampled forward CUDA-event pairs as ``SideEvidence.event_totals`` (empty:
    none sampled); totals add up exactly from node to group."""
    forward_stage: str = ""
    """The stage the event pairs bracket (empty: none sampled)."""
    typical: tuple[tuple[int, int], ...] = ()
    """Per broad stage, in the summary's order: ``(rank, mean ns per step)`` of a rank whose
    time in the stage is typical of the group (``node_payload.typical_ranks``; the profiler
    router's reference); empty when the group has none."""
    rows: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)
    """The rows a capture request asked for: per named rank of the group, the first global
    step and its durations (ns, ``[steps][stages]``) over the captured steps in this window."""
    collectives: CollectiveSummary | None = None
    """The group's timed collectives, summarized (``analysis.collective_summary``); None when
    none of its ranks watched any. Absent from the metadata when None."""
    roles: tuple[tuple[str, int], ...] = ()
    """When its ranks have roles: per role, the byte length of that role's summary, which
    follows the group's own summary in the body, in this order (0: the group's summary itself,
    every rank of the group having that role). Absent from the metadata when empty."""
    body: bytes = b""

    @property
    def nodes(self) -> range:
        return range(self.first_node, self.first_node + self.node_count)


_COUNT_FIELDS = (
    "window",
    "first_step",
    "last_step",
    "first_node",
    "node_count",
    "contract_violations",
    "overlap_ns",
)


def encode_node_part(part: NodePart) -> bytes:
    meta = {name: getattr(part, name) for name in _COUNT_FIELDS}
    meta.update(
        missing_nodes={str(k): v for k, v in part.missing_nodes.items()},
        missing_ranks=list(part.missing_ranks),
        mismatched_ranks=list(part.mismatched_ranks),
        notes=list(part.notes),
        hosts={str(k): v for k, v in part.hosts.items()},
        self_cost_max=dict(part.self_cost_max),
        events=list(part.events),
        forward_stage=part.forward_stage,
        typical=[list(pair) for pair in part.typical],
        rows={str(r): [first, [list(v) for v in rows]] for r, (first, rows) in part.rows.items()},
    )
    if part.roles:
        meta["roles"] = [list(pair) for pair in part.roles]
    if part.collectives is not None:
        meta["collectives"] = part.collectives.to_dict()
    return seal_envelope(_HEADER, MAGIC, NODE_WIRE_VERSION, meta, part.body, packed=True)


def decode_node_part(data: bytes) -> NodePart:
    """Parse and validate one envelope; raises ReportFormatError."""
    meta, body = open_envelope(
        data, _HEADER, MAGIC, NODE_WIRE_VERSION, MAX_META_BYTES, "node payload", packed=True
    )
    expected = {*_COUNT_FIELDS, "missing_nodes", "missing_ranks", "mismatched_ranks"}
    expected |= {"notes", "hosts", "self_cost_max", "events", "forward_stage", "typical", "rows"}
    if not isinstance(meta, dict) or set(meta) - {"roles", "collectives"} != expected:
        raise ReportFormatError(f"node payload metadata must hold exactly {sorted(expected)}")
    values: dict[str, Any] = {
        name: check_meta_value("count", meta[name], f"node payload {name}")
        for name in _COUNT_FIELDS
    }
    values["missing_ranks"] = _counts(meta, "missing_ranks")
    values["mismatched_ranks"] = _counts(meta, "mismatched_ranks")
    values["notes"] = check_meta_value("names", meta["notes"], "node payload notes")
    values["missing_nodes"] = _by_node(meta, "missing_nodes")
    values["hosts"] = _by_node(meta, "hosts")
    values["self_cost_max"] = _reals(meta["self_cost_max"])
    events = meta["events"]
    if (
        not isinstance(events, list)
        or len(events) not in (0, 4)
        or not all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in events)
    ):
        raise ReportFormatError("node payload events must be empty or four numbers >= 0")
    values["events"] = tuple(float(v) for v in events)
    if not isinstance(meta["forward_stage"], str):
        raise ReportFormatError("node payload forward_stage must be text")
    values["forward_stage"] = meta["forward_stage"]
    values["typical"] = _typical(meta["typical"])
    values["rows"] = _rows(meta["rows"], values["first_step"], values["last_step"])
    values["roles"] = _roles(meta.get("roles", []), len(body))
    if "collectives" in meta:
        values["collectives"] = CollectiveSummary.from_dict(meta["collectives"])
    part = NodePart(body=bytes(body), **values)
    if part.node_count < 1 or any(n not in part.nodes for n in part.missing_nodes):
        raise ReportFormatError("node payload names nodes outside the group it covers")
    return part


def _counts(meta: dict[str, Any], name: str) -> tuple[int, ...]:
    items = meta[name]
    if not isinstance(items, list):
        raise ReportFormatError(f"node payload {name} is not a list")
    return tuple(check_meta_value("count", v, f"node payload {name}") for v in items)


def _by_node(meta: dict[str, Any], name: str) -> dict[int, str]:
    items = meta[name]
    if not isinstance(items, dict) or not all(k.isdigit() for k in items):
        raise ReportFormatError(f"node payload {name} is not an object keyed by node")
    return {int(k): check_meta_value("text", v, f"node payload {name}") for k, v in items.items()}


def _typical(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not all(
        isinstance(pair, list) and len(pair) == 2 for pair in value
    ):
        raise ReportFormatError("node payload typical must be a list of [rank, ns] pairs")
    return tuple(
        (
            check_meta_value("count", rank, "node payload typical rank"),
            check_meta_value("count", ns, "node payload typical ns"),
        )
        for rank, ns in value
    )


def _roles(value: Any, body_bytes: int) -> tuple[tuple[str, int], ...]:
    if (
        not isinstance(value, list)
        or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in value)
        or len({p[0] for p in value}) != len(value)
    ):
        raise ReportFormatError("node payload roles must be a list of distinct [role, bytes]")
    roles = tuple((p[0], check_meta_value("count", p[1], "node payload role bytes")) for p in value)
    if sum(n for _, n in roles) >= body_bytes > 0:
        raise ReportFormatError("node payload role summaries exceed its body")
    return roles


def _rows(
    value: Any, first_step: int, last_step: int
) -> dict[int, tuple[int, tuple[tuple[int, ...], ...]]]:
    """Named ranks' rows: at most the ranks of ``ROW_REQUESTS`` requests, each a first step
    inside the window and a list of equally long lists of nanoseconds that end inside it too."""
    where = "node payload rows"
    most = ROW_REQUESTS * MAX_NAMED_RANKS
    if not isinstance(value, dict) or len(value) > most:
        raise ReportFormatError(f"{where} must be an object of at most {most} ranks")
    out: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = {}
    for rank, item in value.items():
        if not rank.isdigit() or not isinstance(item, list) or len(item) != 2:
            raise ReportFormatError(f"{where} must map ranks to [first step, rows]")
        first = check_meta_value("count", item[0], f"{where} first step")
        rows = item[1]
        if (
            not isinstance(rows, list)
            or not rows
            or not first_step <= first <= first + len(rows) - 1 <= last_step
            or not all(isinstance(row, list) and len(row) == len(rows[0]) for row in rows)
        ):
            raise ReportFormatError(f"{where} of rank {rank} must be rows of the window's steps")
        out[int(rank)] = (
            first,
            tuple(tuple(check_meta_value("count", v, where) for v in row) for row in rows),
        )
    return out


def _reals(value: Any) -> dict[str, float]:
    if not isinstance(value, dict) or not all(
        type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in value.values()
    ):
        raise ReportFormatError("node payload self_cost_max must map names to numbers >= 0")
    return {str(k): float(v) for k, v in value.items()}


def capped_notes(notes: list[str]) -> tuple[str, ...]:
    """At most ``MAX_NOTES`` notes, the last saying how many more there were."""
    if len(notes) <= MAX_NOTES:
        return tuple(notes)
    return (*notes[: MAX_NOTES - 1], f"... and {len(notes) - MAX_NOTES + 1} more note(s)")
