"""What a node's ranks keep for the day their collector dies, under hierarchical collection: real
``NodeLeader`` and ``NodeMember`` collectors on a real c10d store in one process, laid out as
ranks of jobs up to 100,000 ranks (12,500 nodes of 8, the default fan-in of 64: rank 0 heads
three tree levels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch.distributed")

from stagefrontier.collect.base import CollectorSettings
from stagefrontier.collect.hierarchical import NodeLeader, NodeMember
from stagefrontier.collect.node import NodeIdentity
from stagefrontier.collect.node_store import loopback_store
from stagefrontier.collect.node_tree import DEFAULT_FAN_IN, level_wait_s, top_level
from stagefrontier.collect.store import release_scope
from stagefrontier.window.rank import RankWindow

TIMEOUT_S = 5.0


@pytest.fixture
def job_store() -> Any:
    return loopback_store(world_size=1, timeout_s=TIMEOUT_S)


def _settings(rank: int, world_size: int, out: Path) -> CollectorSettings:
    return CollectorSettings(rank, world_size, out, TIMEOUT_S, regression=None)


@pytest.mark.parametrize("nodes", [2, 65, 12_500])
def test_a_live_collector_is_never_judged_gone_while_it_waits_for_its_tree(
    nodes: int, job_store: Any, tmp_path: Path
) -> None:
    """A leader judges rank 0 gone after its done counter stood still longer than rank 0 can
    wait for a window (its top level's wait) and a collect timeout more, as a flat sender
    does for a flat rank 0's one timeout; a member likewise for its leader. Before, every
    watch waited twice the timeout and 5 s: 15 s, while rank 0 of 65 nodes waits 15 s for a
    missing level-2 group and of 12,500 nodes 20 s for a level-3 one."""
    size = 8
    world = nodes * size
    rank0_wait_s = level_wait_s(top_level(0, nodes, DEFAULT_FAN_IN), TIMEOUT_S)
    last = nodes - 1
    leader = NodeLeader(
        _settings(last * size, world, tmp_path),
        node=NodeIdentity(node=last, first_rank=last * size, size=size, host=""),
        store=job_store,
    )
    release_scope(leader.scope)
    member = NodeMember(  # a member of rank 0's node: its leader is rank 0
        _settings(1, world, tmp_path),
        node=NodeIdentity(node=0, first_rank=0, size=size, host=""),
        store=job_store,
    )
    leaf = NodeMember(  # a member of the last node, whose leader heads no level
        _settings(last * size + 1, world, tmp_path),
        node=NodeIdentity(node=last, first_rank=last * size, size=size, host=""),
        store=job_store,
    )
    try:
        for watcher in (leader, member):
            assert watcher._watch is not None
            assert watcher._watch.silent_after_s > rank0_wait_s + TIMEOUT_S, nodes
        assert leaf._watch is not None  # its leader waits one timeout, as flat rank 0 does
        assert leaf._watch.silent_after_s > level_wait_s(0, TIMEOUT_S) + TIMEOUT_S
    finally:
        for collector in (leaf, member, leader):
            collector.close()
    if nodes == 12_500:
        assert rank0_wait_s == 20.0  # three levels below rank 0


def test_rank_0_holds_none_of_its_nodes_windows(tmp_path: Path) -> None:
    """A leader holds the node's windows its collector has not finished, to keep them should
    that collector die. Rank 0 has none above it: it held up to 64 windows of its node for the
    whole run."""
    job_store = loopback_store(world_size=1, timeout_s=TIMEOUT_S)
    rank0 = NodeLeader(
        _settings(0, 1, tmp_path),
        node=NodeIdentity(node=0, first_rank=0, size=1, host=""),
        store=job_store,
    )
    stages = ("data.next_wait", "step.other_cpu_wall")
    durations = np.array([[3_000_000, 1_000_000]] * 4, dtype=np.int64)
    for index in range(3):
        window = RankWindow(index, 4 * index, 4 * index + 3, 0, stages, durations, durations[:, 0])
        assert rank0.submit(window)
    rank0.close()
    assert len((tmp_path / "windows.jsonl").read_text().splitlines()) == 3  # all analyzed
    assert rank0._recent.held() == []
