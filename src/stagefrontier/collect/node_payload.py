"""What a node leader condenses its node's windows into, and how rank 0 combines the nodes.

A part's body is the node's windows in the wire format, one after another, each behind its
length. (The node summary replaces this body once its codec exists; the envelope around it,
``collect.node_wire``, stays.)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ReportFormatError
from ..record.window import AnalyzedWindow, MergedWindow, RankWindow
from .base import merge_received
from .node import NodeIdentity
from .node_wire import NodePart
from .wire import decode_window, encode_window

_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class NodeContents:
    """The node's windows that reached its leader."""

    windows: list[RankWindow]

    def encode(self) -> bytes:
        out = []
        for window in self.windows:
            data = encode_window(window)
            out += [_LENGTH.pack(len(data)), data]
        return b"".join(out)


def node_contents(node: NodeIdentity, windows: Sequence[RankWindow]) -> NodeContents:
    """The part of ``windows`` that belongs to ``node`` (its leader's gather holds nothing else)."""
    return NodeContents([w for w in windows if w.rank in node.ranks])


def decode_contents(body: bytes, ranks: range) -> NodeContents:
    """Parse a part's body; raises ReportFormatError (a window of a rank outside the node, a
    length past the end, a window that does not decode)."""
    windows, offset = [], 0
    while offset < len(body):
        if offset + _LENGTH.size > len(body):
            raise ReportFormatError("node body ends inside a length")
        (size,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if offset + size > len(body):
            raise ReportFormatError("node body ends inside a window")
        window = decode_window(body[offset : offset + size])
        offset += size
        if window.rank not in ranks:
            raise ReportFormatError(f"node body holds rank {window.rank}, not of this node")
        windows.append(window)
    return NodeContents(windows)


@dataclass(frozen=True)
class Combined:
    """Every node's part of one window, combined: what rank 0 analyzes."""

    merged: MergedWindow
    nodes: dict[str, Any]
    """The record's ``nodes`` entry: the node size, the nodes present, the nodes missing with
    the reason, and the nodes some of whose ranks are missing."""


def combine_parts(
    parts: dict[int, NodePart],
    layout: dict[int, range],
    world_size: int,
    notes: Sequence[str],
) -> Combined:
    """The parts that arrived, combined; nodes whose part is missing (or does not decode) are
    missing with every rank, and say so in the notes."""
    windows: list[RankWindow] = []
    notes = list(notes)
    rejected: dict[int, str] = {}
    for node, part in sorted(parts.items()):
        try:
            contents = decode_contents(part.body, layout[node])
        except ReportFormatError as exc:
            rejected[node] = f"node {node} summary rejected: {exc}"
            continue
        windows.extend(contents.windows)
        notes.extend(part.notes)
    notes.extend(rejected.values())
    missing = {n: _why_missing(n, notes) for n in layout if n not in parts or n in rejected}
    size = len(next(iter(layout.values()))) if layout else 0
    nodes = {
        "node_size": size,
        "present": sorted(n for n in parts if n not in rejected),
        "missing": {str(n): why for n, why in sorted(missing.items())},
        "partial": {
            str(n): list(p.missing_ranks)
            for n, p in sorted(parts.items())
            if p.missing_ranks and n not in rejected
        },
    }
    return Combined(merge_received(windows, world_size, notes), nodes)


def _why_missing(node: int, notes: Sequence[str]) -> str:
    prefix = f"node {node} "
    return next((n for n in notes if n.startswith(prefix)), f"node {node} sent nothing")


def node_record(analyzed: AnalyzedWindow, combined: Combined) -> AnalyzedWindow:
    """``analyzed`` with the nodes' entry, for the record, the packet and the log line."""
    return replace(analyzed, nodes=combined.nodes)
