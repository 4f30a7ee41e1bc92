"""The tree node parts travel up: bounded fan-in, rank 0's node at the top.

Nodes are numbered ``0 .. M-1``. With fan-in ``F``, a level-``l`` group is ``F**l`` consecutive
nodes, and its first node's leader combines it: at level ``l`` it reads the level ``l-1`` parts of
the ``F - 1`` groups after its own (its own it holds already) and makes the group's part. Each
leader sends the part of the largest group it heads up to the head of the next larger one; node
0 heads every level and analyzes the top one, so no leader ever reads more than ``F - 1`` parts
per window and the tree is ``ceil(log_F M)`` levels deep.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_FAN_IN = 64
"""Parts a leader reads per window and level (the job store then serves at most this many reads
per leader per window). 64 keeps 100,000 ranks of 8 per node (12,500 nodes) to three levels."""


@dataclass(frozen=True)
class Level:
    """One level this node heads: the children it reads (first node of each child group) and
    the nodes the level's group covers."""

    level: int
    children: tuple[int, ...]
    first_node: int
    node_count: int


def headed_levels(node: int, nodes: int, fan_in: int) -> list[Level]:
    """The levels ``node`` heads, lowest first (empty for a node that only sends its own)."""
    if fan_in < 2:
        raise ValueError(f"fan-in must be >= 2, got {fan_in}")
    levels = []
    level = 1
    while node % fan_in**level == 0 and fan_in ** (level - 1) < nodes:
        child = fan_in ** (level - 1)
        children = tuple(range(node + child, min(node + fan_in**level, nodes), child))
        count = min(fan_in**level, nodes - node)
        if children:
            levels.append(Level(level, children, node, count))
        level += 1
    return levels


def top_level(node: int, nodes: int, fan_in: int) -> int:
    """The level of the part ``node`` sends up (0: its own node's part); its parent reads it
    under that level's key."""
    levels = headed_levels(node, nodes, fan_in)
    return levels[-1].level if levels else 0


def group_span(first_node: int, level: int, nodes: int, fan_in: int) -> range:
    """The nodes a level-``level`` part that starts at ``first_node`` covers."""
    return range(first_node, min(first_node + fan_in**level, nodes))


def level_wait_s(level: int, timeout_s: float) -> float:
    """How long after a window's end a head waits for the parts of its level-``level``
    children: one collect timeout for each level below, each of which may have waited its own,
    and one for its own."""
    return timeout_s * (level + 1)
