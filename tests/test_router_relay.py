"""The capture request's way to the ranks under hierarchical collection (``route.relay``), with
real c10d stores in one process: a job store, and the node store a real ``NodeLeader`` serves
for a real ``NodeMember``. The job store's reads are counted by a ``RequestChannel`` that counts
its own reads; the store under it is real."""

from __future__ import annotations

import gc
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.route.decide import start_margin
from stagefrontier.route.relay import (
    JOB_READS_PER_S,
    RequestRelay,
    leader_poll_s,
    request_poll_s,
)
from stagefrontier.route.requests import REQUEST_KEY, CaptureRequest, RequestChannel

POLL_S = 0.05


class CountedChannel(RequestChannel):
    """A channel to the job's store that counts its reads of the request key."""

    reads = 0

    def read(self, key: str) -> bytes | None:
        self.reads += 1
        return super().read(key)


@pytest.fixture
def job_store() -> Any:
    pytest.importorskip("torch.distributed")
    from stagefrontier.collect.node_store import loopback_store

    return loopback_store(world_size=1, timeout_s=5.0)


def _node_pair(job_store: Any, tmp_path: Path, world_size: int = 4, size: int = 2) -> Any:
    """Node 1's leader (rank ``size``) and its member (rank ``size + 1``), real collectors on the
    job's store. In one process the member must claim the key scope the leader published its
    store's address under, as the member's own process would."""
    from stagefrontier.collect.base import CollectorSettings
    from stagefrontier.collect.hierarchical import NodeLeader, NodeMember
    from stagefrontier.collect.node import NodeIdentity
    from stagefrontier.collect.store import release_scope

    node = NodeIdentity(node=1, first_rank=size, size=size, host="")
    leader = NodeLeader(
        CollectorSettings(size, world_size, tmp_path, 5.0, regression=None),
        node=node,
        store=job_store,
    )
    release_scope(leader.scope)
    member = NodeMember(
        CollectorSettings(size + 1, world_size, tmp_path, 5.0, regression=None),
        node=node,
        store=job_store,
    )
    assert member.scope == leader.scope
    return leader, member


def _relay(job_store: Any, collector: Any) -> tuple[RequestRelay, CountedChannel]:
    channel = CountedChannel(job_store)
    relay = RequestRelay(channel, POLL_S)
    relay.bind(collector)
    return relay, channel


def test_a_member_reads_the_request_its_leader_copied_and_never_the_job_store(
    job_store: Any, tmp_path: Path
) -> None:
    leader, member = _node_pair(job_store, tmp_path)
    rank0 = RequestChannel(job_store)  # the coordinator's channel
    lead, lead_job = _relay(job_store, leader)
    follow, follow_job = _relay(job_store, member)
    try:
        assert lead.read() is None and follow.read() is None  # no request open
        first = CaptureRequest("w00003", (3, 0), 120, 5, "data.next_wait").encode()
        rank0.write(REQUEST_KEY, first)
        assert follow.read() is None  # the leader has not read it yet
        assert lead.read() == first
        assert follow.read() == first and CaptureRequest.decode(first).ranks == (3, 0)
        second = CaptureRequest("w00009", (1, 2), 300, 5).encode()
        rank0.write(REQUEST_KEY, second)  # a new request replaces the open one
        assert lead.read() == second and follow.read() == second
        rank0.delete(REQUEST_KEY)  # the incident closed
        assert lead.read() is None and follow.read() is None
        assert lead_job.reads == 4
        assert follow_job.reads == 0  # the member read its node's store only
    finally:
        lead.close()
        follow.close()
        member.close()
        leader.close()


def test_a_rank_reads_nothing_before_its_collector_says_how() -> None:
    relay = RequestRelay(RequestChannel(), POLL_S)
    assert not relay.due()  # a timer built before init_process_group: no collector yet
    relay.bind(None)
    assert not relay.due()
    relay.bind(object())  # a flat collector: the job's store at every poll
    assert relay.due() and relay.due() and relay.interval == POLL_S


def test_a_leaders_interval_keeps_all_leaders_under_the_job_stores_read_rate() -> None:
    assert leader_poll_s(1, POLL_S) == POLL_S  # one node: the poll itself
    assert leader_poll_s(100, POLL_S) == pytest.approx(0.1)
    assert leader_poll_s(12_500, POLL_S) == pytest.approx(12.5)  # 100,000 ranks of 8
    for nodes in (1, 50, 51, 100, 12_500, 100_000):
        assert nodes / leader_poll_s(nodes, POLL_S) <= JOB_READS_PER_S * (1 + 1e-12)
    slow = RequestRelay(RequestChannel(), POLL_S)
    slow.join_node(leads=True, nodes=12_500, open_node_store=lambda: None)
    assert slow.interval == pytest.approx(12.5)
    assert slow.due() and not slow.due()  # read now, then not for 12.5 s
    rank0 = RequestRelay(RequestChannel(), POLL_S)
    rank0.join_node(leads=True, nodes=12_500, open_node_store=lambda: None, rank0=True)
    assert rank0.due() and rank0.due()  # rank 0 writes the request: it reads at the poll


def test_the_start_margin_covers_the_leaders_interval_and_the_members_poll(
    job_store: Any, tmp_path: Path
) -> None:
    from stagefrontier import ProfilerRouter
    from stagefrontier.collect.base import CollectorSettings
    from stagefrontier.collect.hierarchical import NodeMember
    from stagefrontier.collect.node import NodeIdentity
    from stagefrontier.route.coordinator import Coordinator

    node = NodeIdentity(node=7, first_rank=56, size=8, host="")
    member = NodeMember(  # a member in a job of 100,000 ranks, 8 a node: 12,500 nodes
        CollectorSettings(57, 100_000, tmp_path, 5.0, regression=None), node=node
    )
    member.close()
    travel = request_poll_s(member, POLL_S)
    assert travel == pytest.approx(12.5 + POLL_S)
    assert request_poll_s(object(), POLL_S) == POLL_S  # flat collection: the poll

    config = ProfilerRouter(poll_s=POLL_S, capture_timeout_s=0.0)
    channel = RequestChannel(job_store)
    coordinator = Coordinator(
        config,
        out_dir=str(tmp_path),
        channel=channel,
        current_step=lambda: 1000,
        request_poll_s=travel,
    )
    coordinator.step_s = 0.5
    coordinator.request_capture([57, 3], 5, "data.next_wait")
    coordinator.tick()
    data = channel.read(REQUEST_KEY)
    assert data is not None
    request = CaptureRequest.decode(data)
    margin = request.first_step - 1000
    assert margin == start_margin(0.5, travel) == math.ceil((2 * travel + 0.5) / 0.5) + 2
    assert margin > start_margin(0.5, POLL_S)
    # the steps before the capture last longer than the request's way there, twice over
    assert (margin - 2) * 0.5 >= 2 * travel
    assert coordinator.open is not None
    assert "12550 ms way to every rank" in coordinator.open.incident["reasons"][-1]


def test_a_member_of_a_dead_leader_reads_the_job_store_and_says_why(
    job_store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    leader, member = _node_pair(job_store, tmp_path)
    rank0 = RequestChannel(job_store)
    lead, _ = _relay(job_store, leader)
    follow, follow_job = _relay(job_store, member)
    request = CaptureRequest("w00004", (3,), 80, 5).encode()
    rank0.write(REQUEST_KEY, request)
    assert lead.read() == request and follow.read() == request
    assert follow_job.reads == 0
    # The leader dies: its collector, its router and with them the node's store are gone.
    leader.close()
    lead.close()
    del lead, leader
    gc.collect()
    try:
        with caplog.at_level(logging.WARNING, logger="stagefrontier"):
            assert follow.read() == request  # read from the job's store instead
        assert follow_job.reads == 1
        assert "this node's store is unreachable" in caplog.text
        assert "reads capture requests from the job's store" in caplog.text
        assert follow.interval == leader_poll_s(2, POLL_S)  # counted as a leader would be
        replaced = CaptureRequest("w00005", (3,), 90, 5).encode()
        rank0.write(REQUEST_KEY, replaced)
        assert follow.read() == replaced and follow_job.reads == 2
    finally:
        follow.close()
        member.close()


def test_a_member_whose_leader_died_before_it_connected_is_refused_at_once(
    job_store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The member connects to its node's store only at its first read: a dead leader's port
    refuses it then, where the store's client retried the connection for its whole timeout
    (twice 10 s for a member of a dead node leader, which was never captured)."""
    leader, member = _node_pair(job_store, tmp_path)
    follow, follow_job = _relay(job_store, member)
    request = CaptureRequest("w00004", (3,), 80, 5).encode()
    RequestChannel(job_store).write(REQUEST_KEY, request)
    # The leader dies before the member's first read: its store is gone, its address stays.
    leader.close()
    del leader
    gc.collect()
    try:
        with caplog.at_level(logging.WARNING, logger="stagefrontier"):
            assert follow.read() == request
        assert follow_job.reads == 1
        assert re.search(
            r"node 1's store at [\d.]+:\d+ cannot be reached \(its leader is gone\?\): .*refused",
            caplog.text,
        ), caplog.text
    finally:
        follow.close()
        member.close()


def test_a_leader_without_a_node_store_still_reads_the_request_and_says_so_once(
    job_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def no_node_store() -> Any:
        raise RuntimeError("no node store")

    channel = CountedChannel(job_store)
    lead = RequestRelay(channel, POLL_S)
    lead.join_node(leads=True, nodes=2, open_node_store=no_node_store)
    request = CaptureRequest("w00002", (2,), 50, 5).encode()
    RequestChannel(job_store).write(REQUEST_KEY, request)
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        assert lead.read() == request and lead.read() == request  # its own captures go on
    assert channel.reads == 2
    warned = [r for r in caplog.records if "cannot be copied into this node's store" in r.message]
    assert len(warned) == 1 and "no node store" in warned[0].getMessage()
