"""What a node leader condenses its node's windows into, how a group's head combines its
children's parts, and how rank 0 analyzes the top part.

A part's body is the group's windows in the wire format, one after another, each behind its
length. (The node summary replaces this body once its codec exists; the envelope around it,
``collect.node_wire``, stays.)
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ReportFormatError
from ..record.window import AnalyzedWindow, MergedWindow, RankWindow
from .base import analyze_received, merge_received
from .node import NodeIdentity
from .node_wire import NodePart, capped_notes
from .wire import decode_window, encode_window

_LENGTH = struct.Struct("<Q")


def encode_windows(windows: Sequence[RankWindow]) -> bytes:
    out = []
    for window in windows:
        data = encode_window(window)
        out += [_LENGTH.pack(len(data)), data]
    return b"".join(out)


def decode_windows(body: bytes) -> list[RankWindow]:
    """Parse a part's body; raises ReportFormatError."""
    windows, offset = [], 0
    while offset < len(body):
        if offset + _LENGTH.size > len(body):
            raise ReportFormatError("node body ends inside a length")
        (size,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if offset + size > len(body):
            raise ReportFormatError("node body ends inside a window")
        windows.append(decode_window(body[offset : offset + size]))
        offset += size
    return windows


def node_part(
    node: NodeIdentity,
    own: RankWindow,
    windows: Sequence[RankWindow],
    notes: Sequence[str],
    late: Sequence[int],
) -> NodePart:
    """The leader's part for its node: the windows that arrived (``own`` first), the ranks
    that did not, and ``late``: those of them that said nothing (not announced silent), each
    named in a note with the node."""
    merged = merge_received(list(windows), node.first_rank + node.size, notes)
    kept = merged.ranks
    present = {w.rank for w in windows}
    notes = list(merged.notes)
    if late:
        notes.append(f"{node.label()}: rank(s) {list(late)} sent no window to the node leader")
    return NodePart(
        window=own.window,
        first_step=own.first_step,
        last_step=own.last_step,
        first_node=node.node,
        node_count=1,
        missing_ranks=tuple(r for r in node.ranks if r not in present),
        mismatched_ranks=tuple(merged.mismatched_ranks),
        notes=capped_notes(notes),
        hosts={node.node: own.hostname},
        contract_violations=sum(w.contract_violations for w in kept),
        overlap_ns=sum(w.overlap_ns for w in kept),
        wall_ns=sum(int(w.wall_ns.sum()) for w in kept),
        body=encode_windows(kept),
    )


def combine_parts(
    own: NodePart,
    node_count: int,
    children: Mapping[int, NodePart],
    missing: Mapping[range, str],
    notes: Sequence[str],
) -> NodePart:
    """The part of the group ``own`` heads (``node_count`` nodes from ``own.first_node``):
    ``own`` and the children that arrived combined, the ``missing`` children's nodes (a node
    span each, with the reason) and the wait's ``notes`` added. A child whose body does not
    decode is reported missing with the error."""
    parts = [own]
    gone: dict[int, str] = {}
    for span, why in missing.items():
        gone.update(dict.fromkeys(span, why))
    bodies = [own.body]
    for child in children.values():
        try:
            decode_windows(child.body)
        except ReportFormatError as exc:
            gone.update(
                dict.fromkeys(child.nodes, f"summary of nodes {_span(child)} rejected: {exc}")
            )
            continue
        parts.append(child)
        bodies.append(child.body)
    return NodePart(
        window=own.window,
        first_step=own.first_step,
        last_step=own.last_step,
        first_node=own.first_node,
        node_count=node_count,
        missing_nodes={**{k: v for p in parts for k, v in p.missing_nodes.items()}, **gone},
        missing_ranks=tuple(sorted(r for p in parts for r in p.missing_ranks)),
        mismatched_ranks=tuple(sorted(r for p in parts for r in p.mismatched_ranks)),
        notes=capped_notes([*notes, *(n for p in parts for n in p.notes)]),
        hosts={k: v for p in parts for k, v in p.hosts.items()},
        contract_violations=sum(p.contract_violations for p in parts),
        overlap_ns=sum(p.overlap_ns for p in parts),
        wall_ns=sum(p.wall_ns for p in parts),
        body=b"".join(bodies),
    )


def _span(part: NodePart) -> str:
    last = part.first_node + part.node_count - 1
    return str(part.first_node) if last == part.first_node else f"{part.first_node}-{last}"


def analyze_part(
    part: NodePart,
    world_size: int,
    node_size: int,
    analyze: Callable[[MergedWindow], AnalyzedWindow],
) -> AnalyzedWindow | None:
    """Rank 0's analysis of the top part; None when the window is lost (logged)."""
    windows = decode_windows(part.body)
    gone = sorted(part.missing_nodes)
    notes = [*part.notes, *(part.missing_nodes[n] for n in gone)]
    merged = merge_received(windows, world_size, _dedupe(notes))
    analyzed = analyze_received(merged, analyze)
    if analyzed is None:
        return None
    return replace(analyzed, nodes=nodes_entry(part, node_size))


def nodes_entry(part: NodePart, node_size: int) -> dict[str, Any]:
    """The record's ``nodes``: how many, which are missing and why, which lack some ranks."""
    partial: dict[str, list[int]] = {}
    for rank in part.missing_ranks:
        partial.setdefault(str(rank // node_size), []).append(rank)
    return {
        "node_size": node_size,
        "nodes": part.node_count,
        "present": part.node_count - len(part.missing_nodes),
        "missing": {str(n): why for n, why in sorted(part.missing_nodes.items())},
        "partial": partial,
    }


def _dedupe(notes: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(notes))
