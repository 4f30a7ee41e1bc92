"""Where a rank's router thread reads the open capture request, and how often.

Under flat collection every rank reads the request key in the job's store at every poll
(``ProfilerRouter.poll_s``). Under hierarchical collection that would be one reader per rank on
one store server (at 100,000 ranks and 50 ms, two million reads a second), so the request fans
out through the node stores the collection already serves:

- a node leader (local rank 0) reads the key in the job's store every ``leader_poll_s``: the
  poll, or longer, so that all leaders together read it at most ``JOB_READS_PER_S`` times a
  second (rank 0, which writes the request, reads at the poll);
- when the value changed (a request written, replaced or deleted), the leader copies its raw
  bytes into its node's store under the same key, or deletes it there;
- the node's other ranks read the key in their node's store, at the poll.

A request then reaches every rank within ``request_poll_s``, the leaders' interval plus the
poll, and rank 0's start margin counts with it. A member that cannot reach its node's store
(its leader died, or never served one) reads the job's store itself, at the leaders' interval,
and says why once.

A failed read (the store busy past its timeout, a connection cut) turns nothing off: the rank
drops its connections and reads again later, waiting twice as long after each failure in a row,
at most ``RETRY_MAX_S``, and says so once (``ProfilerRouter``'s thread). A process with no store
at all (a single process given none) reads nothing more after its first try.

A rank reads nothing until its collector exists (a timer built before ``init_process_group``
builds it at its first window boundary), since only then does it know its node; no request can
be open before, as rank 0's coordinator starts with rank 0's collector.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..collect.hierarchical import NodeLeader, NodeMember, node_store_client
from .requests import REQUEST_KEY, RequestChannel

logger = logging.getLogger("stagefrontier")

JOB_READS_PER_S = 1000.0
"""The most reads a second that all node leaders together make of the request key in the job's
store. One store server answers every client on one thread, some tens of thousands of small
requests a second on a server core; under hierarchical collection it also takes each window's
node parts and the tree heads' reads. A thousand polls a second (each a ``check``, plus a
``get`` while a request is open) keeps the router to a few percent of that, and keeps the
leaders at the poll itself up to 50 nodes (at ``poll_s=0.05``)."""


RETRY_MAX_S = 5.0
"""The longest wait between reads of a store that keeps failing: a request written meanwhile is
still read well within its start margin's few seconds on most jobs, and a rank with a dead
store costs it one read every five seconds."""


def leader_poll_s(nodes: int, poll_s: float) -> float:
    """A node leader's interval between reads of the job's store: ``poll_s``, or ``nodes /
    JOB_READS_PER_S`` when that is longer."""
    return max(poll_s, nodes / JOB_READS_PER_S)


def _nodes(collector: NodeLeader | NodeMember) -> int:
    return max(1, int(collector.world_size) // collector.node.size)


def request_poll_s(collector: Any, poll_s: float) -> float:
    """The longest a request waits, between polls, to reach a rank: the leaders' interval plus
    the poll under hierarchical collection (``collector`` a node leader or member), else the
    poll."""
    if isinstance(collector, NodeLeader | NodeMember):
        return leader_poll_s(_nodes(collector), poll_s) + poll_s
    return poll_s


class RequestRelay:
    """One rank's way to the request: ``due`` says whether to read now, ``read`` reads it (and,
    on a node leader, copies a change into the node's store). ``read`` raises when the job's
    store fails; the caller then calls ``failed``, which backs the next read off."""

    def __init__(
        self, job: RequestChannel, poll_s: float, closing: Callable[[], bool] = lambda: False
    ) -> None:
        """``job``: this rank's channel to the job's store; ``closing``: whether the rank's
        timer is closing (a node store gone then is the end of the run, not a dead leader)."""
        self.job = job
        self.poll_s = poll_s
        self.interval = poll_s
        self._closing = closing
        self._way: str | None = None  # "job", "leader", "member" or "off"; None until bound
        self._node: RequestChannel | None = None  # a leader copies into it, a member reads it
        self._fallback_s = poll_s
        self._copied: bytes | None = None
        self._copy_warned = False
        self._next = 0.0
        self.failures = 0
        """Reads failed in a row."""
        self._retry_at = 0.0

    def bind(self, collector: Any) -> None:
        """Choose the way once the rank's collector exists (none until then: ``due`` is False;
        flat for every collector but a node leader's or member's)."""
        if self._way is not None or collector is None:
            return
        self._way = "job"
        if isinstance(collector, NodeLeader | NodeMember):
            self.join_node(
                leads=isinstance(collector, NodeLeader),
                nodes=_nodes(collector),
                open_node_store=lambda: node_store_client(collector),
                rank0=int(collector.rank) == 0,
            )

    def join_node(
        self, *, leads: bool, nodes: int, open_node_store: Callable[[], Any], rank0: bool = False
    ) -> None:
        """Read through the node's store (``open_node_store`` opens a client of it) as its
        leader (``leads``) or a member, in a job of ``nodes`` nodes."""
        self._way = "leader" if leads else "member"
        self._fallback_s = leader_poll_s(nodes, self.poll_s)
        self._node = RequestChannel(scope=self.job.scope, open_raw=open_node_store)
        self.interval = self._fallback_s if leads and not rank0 else self.poll_s

    def due(self) -> bool:
        """Whether this poll reads (never before ``bind``; always at the poll's own interval; a
        leader's longer one is kept from its last read)."""
        if self._way in (None, "off"):
            return False
        if self.failures and time.monotonic() < self._retry_at:
            return False
        if self.interval <= self.poll_s:
            return True
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval
        return True

    def read(self) -> bytes | None:
        """The request key's value (None: no request open)."""
        node = self._node
        if node is None:  # flat, or a member whose node's store failed
            return self.job.read(REQUEST_KEY)
        if self._way == "leader":
            data = self.job.read(REQUEST_KEY)
            self._copy(node, data)
            return data
        try:
            return node.read(REQUEST_KEY)
        except Exception as exc:
            return self._fall_back(exc)

    def failed(self) -> float:
        """A read raised: close the connections (a request cut off by a timeout may leave its
        answer in the socket, to be read as the next one's), and wait before the next read:
        the poll, doubled for each failure in a row, at most ``RETRY_MAX_S``. Returns the
        wait."""
        self.failures += 1
        wait = min(RETRY_MAX_S, self.poll_s * 2.0 ** (self.failures - 1))
        self._retry_at = time.monotonic() + wait
        self.close()
        return wait

    @property
    def stopped(self) -> bool:
        return self._way == "off"

    def stop(self) -> None:
        """No read from now on: the process has no store at all (``NoStoreError``), and none
        comes later."""
        self._way = "off"
        self.close()

    def succeeded(self) -> int:
        """A read answered: the failures before it (now forgotten)."""
        failures, self.failures = self.failures, 0
        return failures

    def _copy(self, node: RequestChannel, data: bytes | None) -> None:
        if data == self._copied:
            return
        try:
            if data is None:
                node.delete(REQUEST_KEY)
            else:
                node.write(REQUEST_KEY, data)
        except Exception as exc:  # tried again at the next read; said once
            if self._closing():  # the leader's own timer closed its node's store
                logger.debug("stagefrontier: node store gone at the run's end: %s", exc)
            elif not self._copy_warned:
                self._copy_warned = True
                logger.warning(
                    "stagefrontier: the capture request cannot be copied into this node's "
                    "store (its ranks read the job's store once they cannot reach it): %s",
                    exc,
                )
            return
        self._copied = data

    def _fall_back(self, exc: Exception) -> bytes | None:
        """The node's store failed: read the job's store from now on (at the leaders'
        interval), unless the timer is closing, when the leader's store is gone by design."""
        if self._closing():
            logger.debug("stagefrontier: node store gone at the run's end: %s", exc)
            return None
        self._node = None
        self.interval = self._fallback_s
        self._next = time.monotonic() + self.interval
        logger.warning(
            "stagefrontier: this node's store is unreachable (its leader is gone?): the router "
            "reads capture requests from the job's store every %.3g s instead: %s",
            self.interval,
            exc,
        )
        return self.job.read(REQUEST_KEY)

    def close(self) -> None:
        if self._node is not None:
            self._node.close()
        self.job.close()
