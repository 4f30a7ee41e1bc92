"""The collecting side's wait for one key per peer (``store_keys.PeerWait``), in a real store:
a full hand-off queue cuts the wait only for a peer that already missed a window, never for one
whose part is merely on its way (rank 0's own slow analysis filled the queue)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from stagefrontier.collect.node_store import loopback_store
from stagefrontier.collect.store_keys import PeerWait


def test_a_full_queue_does_not_give_up_on_a_peer_whose_part_is_on_its_way() -> None:
    store = loopback_store()
    taken: list[int] = []
    notes: list[str] = []
    polls: list[str] = []

    def poll(text: str) -> None:
        polls.append(text)
        if len(polls) == 2:  # rank 1's send lands after rank 0's first look
            store.set("w0/r1", b"part")

    left = PeerWait("rank", "window").wait(
        store,
        {1: "w0/r1"},
        deadline=time.monotonic() + 60.0,
        grace=time.monotonic() + 60.0,
        take=lambda peer, key: taken.append(peer),
        notes=notes,
        give_up=lambda: True,  # the queue is full from the start
        activity=poll,
    )
    assert left == {} and taken == [1] and notes == []


def test_a_full_queue_gives_up_on_a_peer_that_missed_the_previous_window() -> None:
    store = loopback_store()
    wait = PeerWait("rank", "window")
    now = time.monotonic()
    wait.wait(store, {1: "w0/r1"}, deadline=now, grace=now, take=lambda p, k: None, notes=[])
    assert wait.absent == {1}
    notes: list[str] = []
    left = wait.wait(
        store,
        {1: "w1/r1"},
        deadline=time.monotonic() + 60.0,
        grace=time.monotonic() + 60.0,
        take=lambda p, k: None,
        notes=notes,
        give_up=lambda: True,
    )
    assert left == {1: "w1/r1"} and wait.absent == {1}
    assert notes == ["stopped waiting for rank(s) [1]: the hand-off queue filled up"]
